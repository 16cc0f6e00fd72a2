"""A process's probes are attached one after another while it runs: a thread that takes
and drops the GIL between two attaches must not make the BPF side learn the wrong
condition variable (every release would count as an acquisition, for good)."""

import mmap
import os
import struct
import subprocess
import sys
import tempfile
import time

import pytest

TARGET = r"""
import mmap, os, struct, sys
mm = mmap.mmap(os.open(sys.argv[1], os.O_RDWR), 16)
r = int(sys.argv[2])
print("ready", flush=True)
while os.read(r, 1):  # blocked here, the GIL is released; a byte makes it take the GIL
    woken = struct.unpack_from("Q", mm, 0)[0] + 1
    struct.pack_into("Q", mm, 0, woken)
    while struct.unpack_from("Q", mm, 8)[0] < woken:  # hold the GIL until told to go on
        pass
"""


class Target:
    """A single-threaded Python process the test moves between 'holds the GIL' and 'released it'."""

    def __init__(self) -> None:
        self._file = tempfile.NamedTemporaryFile()
        self._file.truncate(16)
        self._mm = mmap.mmap(self._file.fileno(), 16)
        self._r, self._w = os.pipe()
        self.proc = subprocess.Popen([sys.executable, "-c", TARGET, self._file.name, str(self._r)],
                                     pass_fds=(self._r,), stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline() == "ready\n"
        self.holding = False

    def _woken(self) -> int:
        return struct.unpack_from("Q", self._mm, 0)[0]

    def step(self, hold_s: float = 0.0) -> None:
        """Release the GIL if held (drop_gil), then take it (take_gil) and hold it ``hold_s``."""
        woken = self._woken()
        if self.holding:
            struct.pack_into("Q", self._mm, 8, woken)
        os.write(self._w, b"x")
        deadline = time.monotonic() + 10
        while self._woken() == woken:
            assert time.monotonic() < deadline and self.proc.poll() is None, "the target did not wake"
        self.holding = True
        time.sleep(hold_s)

    def release(self) -> None:
        struct.pack_into("Q", self._mm, 8, self._woken())
        self.holding = False

    def close(self) -> None:
        os.close(self._w)
        self.release()
        self.proc.wait(10)
        self.proc.stdout.close()
        os.close(self._r)
        self._mm.close()
        self._file.close()


@pytest.fixture(scope="module")
def tracer():
    if os.geteuid() != 0:
        pytest.fail("this test loads the collector's BPF program: run it as root")
    from otel_gil_collector.__main__ import _import_bcc

    _import_bcc()
    from otel_gil_collector.tracer import Tracer

    made = Tracer(64, 4)
    yield made
    made.close()


def test_a_hand_off_between_two_attaches_teaches_nothing_wrong(tracer, monkeypatch):
    from otel_gil_collector import probes, tracer as tracer_module

    target = Target()
    real = tracer_module.open_uprobe

    def attach_then_hand_off(prog_fd, name, probe, pid):
        fd = real(prog_fd, name, probe, pid)
        target.step()  # holding the GIL across every attach, and a release + take in between
        return fd

    monkeypatch.setattr(tracer_module, "open_uprobe", attach_then_hand_off)
    try:
        traced = tracer.add(target.proc.pid, probes.plan(target.proc.pid), 1_000_000, 5_000_000)
        monkeypatch.setattr(tracer_module, "open_uprobe", real)
        start = time.monotonic_ns()
        for _ in range(5):
            target.step(hold_s=0.03)
        target.release()
        time.sleep(0.05)
        elapsed = time.monotonic_ns() - start
        header = traced.view.header
        slot = traced.view.snapshot(traced.view.find(target.proc.pid))
        assert header.switch_cond == header.gil_cond + header.cond_stride != header.cond_stride
        # Learned right: each of the 5 holds closed by its release; learned wrong, no release
        # is ever seen (hold 0) and every release counts as an acquisition.
        assert 5 * 30e6 <= slot.hold_ns <= elapsed, slot.hold_ns
        assert slot.acquisitions == 6, slot.acquisitions  # the one that taught the conds, then 5
    finally:
        tracer.remove(target.proc.pid)
        target.close()

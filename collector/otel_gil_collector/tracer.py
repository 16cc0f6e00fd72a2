"""The BPF side: compile gil.bpf.c once, then give each registered process its own
slot array and its own uprobes, and take both away again."""

from __future__ import annotations

import ctypes
import logging
import os
import platform
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from otel_gil_collector.bpfsys import MmapableArray
from otel_gil_collector.probes import Probe, ProbePlan
import otel_gil
from otel_gil import ring

log = logging.getLogger("otel_gil.collector")
_SRC = Path(__file__).with_name("gil.bpf.c")
_LAYOUT_DIR = Path(otel_gil.__file__).parent  # gil_layout.h and gil_writer.h: the app side's, shared by both writers


@dataclass
class Traced:
    """One registered process: its slot array and the uprobes attached for it."""

    pid: int
    plan: ProbePlan
    slots: MmapableArray
    view: ring.Ring  # read-only, like the client's
    events: list[str] = field(default_factory=list)
    bootstrap: list[str] = field(default_factory=list)

    @property
    def learned(self) -> bool:
        return bool(self.view.header.switch_cond)


class Tracer:
    """Owns the bcc program; not thread-safe (the server calls it from one thread).

    ``parks``: with the park probes and their map (``otel-gil report``/``top`` on a free-threaded
    target running without its GIL); the daemon never times parks (the in-process writer does),
    so it loads neither: 1.5 MB of locked kernel memory and two programs' verification less."""

    def __init__(self, max_threads: int, max_processes: int, parks: bool = False) -> None:
        from bcc import BPF  # imported late: the preflight checks explain a missing bcc

        self.nslots = max_threads
        self.max_processes = max_processes
        self._bpf = BPF(
            src_file=str(_SRC),
            cflags=[
                f"-I{_LAYOUT_DIR}",
                f"-I{_SRC.parent}",
                f"-DGIL_NSLOTS={max_threads}",
                f"-DGIL_MAX_PROCS={max_processes}",
                *(["-DGIL_TSO"] if platform.machine() == "x86_64" else []),
                *(["-DGIL_PARKS"] if parks else []),
            ],
        )
        self._procs = self._bpf["procs"]
        self._fns = {
            name: self._bpf.load_func(name.encode(), BPF.KPROBE).fd
            for name in ("take_gil_entry", "cond_signal_lnotab", "cond_signal_pairs", "cond_signal_locations",
                         "cond_timedwait", *(("park_entry", "park_return") if parks else ()))
        }
        self.traced: dict[int, Traced] = {}
        self._batches = True  # park_addrs read by BPF_MAP_LOOKUP_BATCH (Linux 5.6)
        self._uprobes: dict[str, int] = {}  # event name -> perf event fd
        # Closing a uprobe waits for an RCU grace period (~100 ms here): done off the
        # server's thread and in parallel, after the BPF side already ignores the pid.
        self._detacher = ThreadPoolExecutor(max_workers=8, thread_name_prefix="detach")

    def add(self, pid: int, plan: ProbePlan, long_wait_ns: int, convoy_ns: int) -> Traced:
        """Create ``pid``'s slot array, publish it to the BPF side, attach its probes."""

        try:
            pidns = os.stat(f"/proc/{pid}/ns/pid")
        except OSError as exc:
            raise OSError(f"cannot read the pid namespace of {pid}: {exc.strerror}") from None

        def init(address: int) -> None:
            h = ring.Header.from_address(address)
            h.magic, h.layout_version, h.slot_size = ring.MAGIC, ring.LAYOUT_VERSION, ring.SLOT_SIZE
            h.nslots, h.clock_id, h.pid = self.nslots, ring.CLOCK_MONOTONIC, pid
            h.cond_stride, h.long_wait_ns, h.convoy_ns = plan.cond_stride, long_wait_ns, convoy_ns
            h.long_hold_ns = long_wait_ns  # one threshold makes a wait or a hold "long"
            h.hold_record_ns = ring.HOLD_RECORD_NS
            h.py = ring.PyLayout.from_buffer_copy(bytes.fromhex(plan.py_layout)) if plan.py_layout else ring.PyLayout()
            h.pidns_dev, h.pidns_ino = pidns.st_dev, pidns.st_ino

        slots = MmapableArray(f"otelgil_{pid}", ring.SLOT_SIZE, ring.entries(self.nslots), init)
        try:
            view = ring.Ring.map_fd(slots.fd, slots.size)
        except BaseException:
            slots.close()
            raise
        traced = Traced(pid, plan, slots, view)
        try:
            self._procs[ctypes.c_uint(pid)] = ctypes.c_int(slots.fd)
            # The bootstrap probe last: a thread it marks in take_gil is then sure to meet the
            # libc probes there. Marked before they exist, a thread could miss its switch_cond
            # signal, keep the mark, and teach learn() its next release's cond: wrong for good.
            for probe in sorted(plan.probes, key=lambda p: p.bootstrap):
                name = self._attach(pid, probe)
                traced.events.append(name)
                if probe.bootstrap:
                    traced.bootstrap.append(name)
        except Exception:
            self._release(traced)
            raise
        self.traced[pid] = traced
        return traced

    def _attach(self, pid: int, probe: Probe) -> str:
        name = f"{'r' if probe.retprobe else 'p'}_otelgil_{pid}_{probe.handler}_{probe.offset:x}"
        self._uprobes[name] = open_uprobe(self._fns[probe.handler], name, probe, pid)
        return name

    def _detach(self, name: str, wait: bool = False) -> None:
        fd = self._uprobes.pop(name, None)
        if fd is not None and wait:
            close_uprobe(name, fd)
        elif fd is not None:
            self._detacher.submit(close_uprobe, name, fd)

    def finish_bootstrap(self) -> None:
        """Detach bootstrap probes of processes whose condition variables are learned."""
        for traced in self.traced.values():
            if traced.bootstrap and traced.learned:
                for name in traced.bootstrap:
                    self._detach(name)
                    traced.events.remove(name)
                traced.bootstrap.clear()
                log.info("pid %d: GIL located, tracing every hand-off", traced.pid)

    def parks_by_address(self, pid: int) -> list[tuple[tuple[int, int], tuple[int, int]]]:
        """((tid, address parked on), (ns parked there, parks)) of ``pid`` so far (park_addrs), read
        in one batch of bpf(2) calls (two per entry before Linux 5.6)."""
        table = self._bpf["park_addrs"]
        if self._batches:
            try:
                entries = list(table.items_lookup_batch())
            except Exception:  # bcc's only exception for a bpf(2) error: EINVAL before 5.6
                self._batches = False
        if not self._batches:
            entries = list(table.items())
        return [((k.tid, k.addr), (v.ns, v.parks)) for k, v in entries if k.tgid == pid]

    def remove(self, pid: int, wait: bool = False) -> None:
        """Stop tracing ``pid``; ``wait``: return once its uprobes are gone (bench/park_cost.py's
        blocks without them), not in the background."""
        traced = self.traced.pop(pid, None)
        if traced is not None:
            self._release(traced, wait)

    def _release(self, traced: Traced, wait: bool = False) -> None:
        try:
            del self._procs[ctypes.c_uint(traced.pid)]  # from now on the BPF side ignores the pid
        except KeyError:
            pass
        for name in traced.events:
            self._detach(name, wait)
        traced.events.clear()
        traced.slots.close()  # the map lives on while the client still maps it

    def close(self) -> None:
        for pid in list(self.traced):
            self.remove(pid)
        self._detacher.shutdown(wait=True)
        self._bpf.cleanup()


def open_uprobe(prog_fd: int, name: str, probe: Probe, pid: int) -> int:
    """Attach program ``prog_fd`` at ``probe`` in process ``pid`` only: a perf uprobe event's fd.

    Perf events (not tracefs's uprobe_events) so that closing the fd is all a detach takes.
    """
    from bcc import lib

    fd = lib.bpf_attach_uprobe(prog_fd, int(probe.retprobe), name.encode(), probe.path.encode(), probe.offset, pid)
    if fd < 0:
        raise OSError(f"uprobe {probe.handler} at {probe.path}+{probe.offset:#x} failed to attach")
    return fd


def close_uprobe(name: str, fd: int) -> None:
    from bcc import lib

    if lib.bpf_close_perf_event_fd(fd) < 0:
        log.warning("closing uprobe %s failed", name)

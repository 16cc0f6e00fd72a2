"""The registration socket against hostile and broken clients (real collector)."""

import ctypes
import json
import os
import socket
import struct
import subprocess
import sys
import time

import pytest

from otel_gil import protocol


def connect(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.settimeout(10)
    sock.connect(path)
    return sock


@pytest.mark.parametrize(
    "payload, code",
    [
        (b"garbage", protocol.BAD_REQUEST),
        (b"OGIL" + struct.pack("!HHI", 99, 0, 2) + b"{}", protocol.UNSUPPORTED_VERSION),
        (b"OGIL" + struct.pack("!HHI", 1, 0, 50) + b"{}", protocol.BAD_REQUEST),
        (b"OGIL" + struct.pack("!HHI", 1, 0, 5) + b"[1,2]", protocol.BAD_REQUEST),
        (b"OGIL" + struct.pack("!HHI", 1, 0, 4) + b"\xff\xfe{}", protocol.BAD_REQUEST),
        (protocol.encode({"op": "attach", "pid": 1}), protocol.BAD_REQUEST),
        (b"x" * (protocol.MAX_MESSAGE + 100), protocol.BAD_REQUEST),
    ],
)
def test_malformed_messages_get_a_precise_error(collector, payload, code):
    with connect(collector.address) as sock:
        sock.send(payload)
        reply, fds = protocol.receive(sock, max_fds=1)
    assert reply["ok"] is False and reply["error"] == code, reply
    assert not fds


def test_identity_comes_from_the_kernel_not_the_message(collector):
    """A client naming another pid still gets only its own ring."""
    with connect(collector.address) as sock:
        protocol.send(sock, {"op": "hello", "pid": 1, "long_wait_ns": "lots"})
        reply, fds = protocol.receive(sock, max_fds=1)
        try:
            assert reply["ok"], reply
            from otel_gil.ring import Ring

            ring = Ring.map_fd(fds[0], reply["size"])
            assert ring.header.pid == os.getpid()
            assert ring.header.long_wait_ns == 1_000_000  # a bad value falls back to the default
            with pytest.raises(OSError):
                import mmap

                mmap.mmap(fds[0], reply["size"], mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            for fd in fds:
                os.close(fd)
    assert f"pid {os.getpid()} (uid 0) registered" in collector.log_text()


def test_silent_client_is_dropped_and_honest_ones_still_served(collector):
    silent = connect(collector.address)
    try:
        with connect(collector.address) as sock:
            protocol.send(sock, {"op": "hello"})
            reply, fds = protocol.receive(sock, max_fds=1)
            for fd in fds:
                os.close(fd)
        assert reply["ok"], reply
    finally:
        silent.close()


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_exit_detaches_probes_and_frees_fds(collector):
    """Registered processes that exit leave no perf event, map or socket fd behind."""
    code = (
        "import os, socket, sys\n"
        "from otel_gil import protocol\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); s.connect(sys.argv[1])\n"
        "protocol.send(s, {'op': 'hello'}); r, fds = protocol.receive(s, 1)\n"
        "assert r['ok'], r\n"
        "print(os.getpid())\n"
    )
    baseline = _fds(collector.proc.pid)
    pids = []
    for _ in range(5):
        child = subprocess.run([sys.executable, "-c", code, collector.address], capture_output=True, text=True, timeout=60)
        assert child.returncode == 0, child.stderr
        pids.append(int(child.stdout))

    def detached(pid: int) -> bool:
        log = collector.log_text()
        return any(f"pid {pid} {why}: probes detached" in log for why in ("exited", "hung up"))

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not all(map(detached, pids)):
        time.sleep(0.1)
    assert all(map(detached, pids)), collector.log_text()
    assert _fds(collector.proc.pid) <= baseline


FORKED = r"""
import json, os, sys, time
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otel_gil import GilInstrumentor

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
GilInstrumentor().instrument(tracer_provider=provider, socket_path=sys.argv[1], backend="collector")
tracer = provider.get_tracer("forked")
out = os.pipe()
for spans in (False, True):
    before = time.monotonic()
    pid = os.fork()
    if pid == 0:
        report = {"pid": os.getpid(), "fork_s": time.monotonic() - before,
                  "started": GilInstrumentor._backend._thread is not None, "statuses": []}
        deadline = time.monotonic() + (10 if spans else 0)
        while time.monotonic() < deadline:
            with tracer.start_as_current_span("child"):
                os.sched_yield()
            status = exporter.get_finished_spans()[-1].attributes.get("gil.status", "ok")
            report["statuses"].append(status)
            if status == "ok":
                break
            time.sleep(0.005)
        time.sleep(0.5)
        os.write(out[1], (json.dumps(report) + "\n").encode())
        os._exit(0)
    os.waitpid(pid, 0)
os.close(out[1])
print(os.read(out[0], 65536).decode(), end="")
"""


def test_a_forked_child_pays_nothing_until_its_first_span(collector):
    """os.fork() returns at once in the child (no registration then, so multiprocessing and
    ForkingMixIn children that make no span never register); its first spans say
    ``pending`` while it registers in the background, then figures follow."""
    done = subprocess.run([sys.executable, "-c", FORKED, collector.address], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    quiet, busy = (json.loads(line) for line in done.stdout.splitlines())
    for child in (quiet, busy):
        assert child["fork_s"] < 0.05 and not child["started"], child
    assert quiet["statuses"] == [] and f"pid {quiet['pid']} " not in collector.log_text()
    assert busy["statuses"][0] == "pending" and busy["statuses"][-1] == "ok", busy["statuses"]
    assert set(busy["statuses"][:-1]) == {"pending"}
    assert f"pid {busy['pid']} (uid 0) registered" in collector.log_text()


def test_a_process_outside_the_collectors_pid_namespace_is_told_why(tmp_path):
    """A collector in a pid namespace of its own (a container without hostPID) gets pid 0 from
    SO_PEERCRED for an app outside it: the app is refused with attach_failed, and the reason
    names the fix (the host's pid namespace), not a process that exited."""
    sock = str(tmp_path / "ns.sock")
    log = tmp_path / "collector.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", sys.executable, "-m", "otel_gil_collector",
                                 "--socket", sock, "-v"], stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(sock):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        with connect(sock) as conn:
            protocol.send(conn, {"op": "hello", "pid": os.getpid()})
            reply, fds = protocol.receive(conn, max_fds=1)
        assert not fds
        assert reply["ok"] is False and reply["error"] == protocol.ATTACH_FAILED, reply
        assert "pid namespace" in reply["message"] and "hostPID" in reply["message"], reply
    finally:
        proc.kill()  # unshare ignores SIGTERM; --kill-child takes the collector with it
        proc.wait(timeout=30)


_PIDFD_GETFD = 438  # x86_64 and aarch64 alike
_NAME_AT = {"bpf-map": 24, "bpf-prog": 64}  # offsetof(struct bpf_map_info / bpf_prog_info, name)


def bpf_names(pid: int) -> dict[str, set[str]]:
    """The names of the BPF maps and programs process ``pid`` holds, by kind ("bpf-map", "bpf-prog")."""
    from otel_gil_collector import bpfsys

    libc = ctypes.CDLL(None, use_errno=True)
    names: dict[str, set[str]] = {kind: set() for kind in _NAME_AT}
    pidfd = os.pidfd_open(pid)
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            kind = os.readlink(f"/proc/{pid}/fd/{fd}").removeprefix("anon_inode:")
            if kind not in _NAME_AT:
                continue
            mine = libc.syscall(_PIDFD_GETFD, pidfd, int(fd), 0)
            assert mine >= 0, os.strerror(ctypes.get_errno())
            try:
                info = ctypes.create_string_buffer(256)
                bpfsys._bpf(bpfsys.BPF_OBJ_GET_INFO_BY_FD, bpfsys._InfoByFd(
                    bpf_fd=mine, info_len=len(info), info=ctypes.addressof(info)))
                names[kind].add(info.raw[_NAME_AT[kind]:_NAME_AT[kind] + 16].split(b"\0")[0].decode())
            finally:
                os.close(mine)
    finally:
        os.close(pidfd)
    return names


def test_the_daemon_loads_no_park_probes(collector):
    """It never times parks (a free-threaded process running without its GIL is refused with
    gil_disabled: its in-process writer times them), so neither their map nor their programs
    are loaded."""
    names = bpf_names(collector.proc.pid)
    assert "procs" in names["bpf-map"] and "take_gil_entry" in names["bpf-prog"], names  # they are read
    assert "park_addrs" not in names["bpf-map"], names
    assert not {"park_entry", "park_return"} & names["bpf-prog"], names

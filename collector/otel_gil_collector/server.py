"""The registration socket: who is asking (SO_PEERCRED, never the message), what to
probe in that process, and tracing it until it exits or hangs up."""

from __future__ import annotations

import errno
import logging
import os
import selectors
import signal
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Optional

from otel_gil_collector import probes
from otel_gil_collector.bpfsys import map_alive, map_id
from otel_gil_collector.planner import Outcome, Planner
from otel_gil_collector.tracer import Traced, Tracer
from otel_gil import protocol

log = logging.getLogger("otel_gil.collector")

SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)  # Linux >= 6.5
HELLO_TIMEOUT_S = 5.0
MAX_PENDING = 1024
MAX_PENDING_PER_UID = 16  # one user's silent connections cannot lock others out
LONG_WAIT_NS = (50_000, 10_000_000_000)  # accepted range of a client's threshold
CONVOY_NS = (1_000, 10_000_000_000)
ACCEPT_PAUSE_S = 0.5  # out of fds: leave new connections in the backlog this long
_TICK_S = 0.1
_CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass
class _Pending:
    conn: socket.socket
    uid: int
    deadline: float
    accepted: float  # CLOCK_BOOTTIME s: the peer existed before this


@dataclass
class _Request:
    """A hello being answered: the peer pinned, its plan being made by a worker."""

    conn: socket.socket
    pid: int
    uid: int
    pidfd: int
    hello: Hello


@dataclass
class _Client:
    pid: int
    uid: int
    conn: socket.socket
    pidfd: int
    traced: Traced
    since: float = field(default_factory=time.monotonic)


class Refused(Exception):
    """A registration the collector will not serve; ``code`` is the protocol error."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def _peercred(conn: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the peer as the kernel recorded them at connect()."""
    pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return pid, uid


def _alive(pidfd: int) -> bool:
    try:
        signal.pidfd_send_signal(pidfd, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another uid's, and no CAP_KILL here (the DaemonSet drops it)
        pass
    return True


def _check_identity(pid: int, uid: int, pidfd: int, connected_before: float) -> None:
    """Refuse unless ``pidfd``'s process is alive and ``/proc/<pid>`` is that process: owned
    by the peer's uid and started before the connection was accepted. Alive after the
    reads, the pinned process held the pid throughout (a live pid is never reused)."""
    gone = Refused(protocol.PROCESS_GONE, f"pid {pid} exited before its registration was served")
    try:
        with open(f"/proc/{pid}/status") as f:
            euid = next(int(line.split()[2]) for line in f if line.startswith("Uid:"))
        with open(f"/proc/{pid}/stat") as f:
            started = int(f.read().rsplit(")", 1)[1].split()[19]) / _CLK_TCK
    except (OSError, StopIteration, ValueError, IndexError):
        raise gone from None
    if not _alive(pidfd):
        raise gone
    if euid != uid or started > connected_before + 1 / _CLK_TCK:
        raise Refused(protocol.PROCESS_GONE, f"pid {pid} is no longer the process that connected (pid reused)")


def _peer(conn: socket.socket, accepted: float) -> tuple[int, int, int]:
    """(pid, uid, pidfd) of the peer, from the kernel: nothing the client says counts.
    Without SO_PEERPIDFD (kernels < 6.5) the pid number is pinned by pidfd_open and checked."""
    pid, uid = _peercred(conn)
    if pid == 0:  # the kernel's answer for a peer outside the collector's pid namespace
        raise Refused(protocol.ATTACH_FAILED, "the collector cannot see this process: it runs in a pid namespace the "
                      "collector is not in (run the collector in the host's: Kubernetes hostPID: true, "
                      "docker/podman --pid=host)")
    try:
        pidfd = struct.unpack("i", conn.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD, 4))[0]
    except OSError as exc:
        if exc.errno not in (errno.ENOPROTOOPT, errno.EINVAL):
            raise Refused(protocol.PROCESS_GONE, f"pid {pid} exited before its registration was served") from None
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            raise Refused(protocol.PROCESS_GONE, f"pid {pid} exited before its registration was served") from None
    try:
        _check_identity(pid, uid, pidfd, accepted)
    except BaseException:
        os.close(pidfd)
        raise
    return pid, uid, pidfd

def _bounded(value: object, lo: int, hi: int, default: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        return default
    return min(max(value, lo), hi)


@dataclass(frozen=True)
class Hello:
    """What the collector takes from a client's hello: tuning, never identity."""

    long_wait_ns: int
    convoy_ns: int
    gil_enabled: bool


def parse_hello(msg: dict) -> Hello:
    """Validate a decoded hello; out-of-range or mistyped values fall back to defaults."""
    if msg.get("op") != "hello":
        raise protocol.ProtocolError(f"expected a hello, got op={str(msg.get('op'))[:32]!r}")
    return Hello(
        _bounded(msg.get("long_wait_ns"), *LONG_WAIT_NS, default=1_000_000),
        _bounded(msg.get("convoy_ns"), *CONVOY_NS, default=5_000_000),
        msg.get("gil_enabled") is True,
    )


class Server:
    """Single-threaded: every message is one datagram and every file of a client is read by a
    worker (planner.py), so no client can stall the loop.

    Limits: ``tracer.max_processes`` rings alive at once, ``max_per_uid`` per uid. A ring
    stays alive while anyone holds it: a client that re-registers and keeps its old fd
    counts twice, its processes' registrations in progress count too."""

    def __init__(
        self,
        path: str,
        tracer: Tracer,
        mode: int = 0o666,
        group: Optional[int] = None,
        max_per_uid: int = 512,
        plan_timeout_s: float = 10.0,
    ) -> None:
        self.path = path
        self.tracer = tracer
        self.max_per_uid = max_per_uid
        self._sel = selectors.DefaultSelector()
        self._pending: dict[int, _Pending] = {}
        self._requests: dict[int, _Request] = {}  # by connection fd, while planned
        self._clients: dict[int, _Client] = {}  # by pid
        self._rings: dict[int, set[int]] = {}  # uid -> ids of the BPF maps handed to it
        self._running = True
        self._accept_paused_until = 0.0
        self._listener = self._listen(path, mode, group)
        self._sel.register(self._listener, selectors.EVENT_READ, self._accept)
        self._planner = Planner(self._sel, self._planned, timeout_s=plan_timeout_s)

    @staticmethod
    def _listen(path: str, mode: int, group: Optional[int]) -> socket.socket:
        os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            probe.connect(path)
        except OSError:
            pass
        else:
            raise SystemExit(f"otel-gil-collector: another collector is already listening on {path}")
        finally:
            probe.close()
        if os.path.lexists(path):
            os.unlink(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sock.bind(path)
        if group is not None:
            os.chown(path, -1, group)
        os.chmod(path, mode)
        sock.listen(socket.SOMAXCONN)  # a fleet of workers may start at once; each waits its turn
        sock.setblocking(False)
        return sock

    def stop(self) -> None:
        self._running = False

    def serve(self) -> None:
        while self._running:
            for key, _ in self._sel.select(_TICK_S):
                try:
                    key.data(key.fileobj)
                except Exception:  # one client's trouble never stops the others being served
                    log.exception("handling %s failed; dropping it", key.fileobj)
                    self._forget(key.fileobj)
            try:
                self._tick()
            except Exception:
                log.exception("housekeeping failed; serving on")

    def _forget(self, fileobj) -> None:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        if fd in self._pending:
            self._close_pending(fd)
            return
        for pid, client in list(self._clients.items()):
            if fd in (client.pidfd, client.conn.fileno()):
                self._drop(pid, "failed")

    def close(self) -> None:
        for pid in list(self._clients):
            self._drop(pid, "collector stopping")
        for fd in list(self._pending):
            self._close_pending(fd)
        for fd in list(self._requests):
            self._planned(fd, probes.UnsupportedProcess(protocol.INTERNAL, "the collector is stopping"))
        self._planner.close()
        self._sel.close()
        self._listener.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def _tick(self) -> None:
        now = time.monotonic()
        for fd, pending in list(self._pending.items()):
            if now > pending.deadline:
                self._hello(pending.conn)  # a hello that came while the loop was busy (attaching) is served
                if fd in self._pending:
                    log.warning("dropping a connection that sent no hello within %.0f s", HELLO_TIMEOUT_S)
                    self._close_pending(fd)
        if self._accept_paused_until and now > self._accept_paused_until:
            self._accept_paused_until = 0.0
            self._sel.register(self._listener, selectors.EVENT_READ, self._accept)
        self._planner.tick()
        self.tracer.finish_bootstrap()

    def _accept(self, listener: socket.socket) -> None:
        try:
            conn, _ = listener.accept()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                # The connection stays in the backlog; polling for it now would spin.
                log.warning("out of file descriptors (%s): not accepting for %.1f s", exc.strerror, ACCEPT_PAUSE_S)
                self._sel.unregister(listener)
                self._accept_paused_until = time.monotonic() + ACCEPT_PAUSE_S
            return
        uid = _peercred(conn)[1]
        if len(self._pending) >= MAX_PENDING or sum(p.uid == uid for p in self._pending.values()) >= MAX_PENDING_PER_UID:
            log.warning("uid %d has too many connections waiting for a hello; refusing one", uid)
            conn.close()
            return
        conn.setblocking(False)
        self._pending[conn.fileno()] = _Pending(
            conn, uid, time.monotonic() + HELLO_TIMEOUT_S, time.clock_gettime(time.CLOCK_BOOTTIME)
        )
        self._sel.register(conn, selectors.EVENT_READ, self._hello)

    def _close_pending(self, fd: int) -> None:
        pending = self._pending.pop(fd, None)
        if pending is not None:
            self._sel.unregister(pending.conn)
            pending.conn.close()

    def _reply_error(self, conn: socket.socket, code: str, message: str) -> None:
        try:
            protocol.send(conn, {"ok": False, "error": code, "message": message})
        except OSError:
            pass

    def _hello(self, conn: socket.socket) -> None:
        fd = conn.fileno()
        try:
            msg, _ = protocol.receive(conn)
        except BlockingIOError:
            return
        except protocol.ProtocolError as exc:
            log.warning("rejected a malformed message: %s", exc)
            self._reply_error(conn, exc.code, str(exc))
            self._close_pending(fd)
            return
        except OSError:
            self._close_pending(fd)
            return
        self._sel.unregister(conn)
        pending = self._pending.pop(fd)
        try:
            hello = parse_hello(msg)
            pid, uid, pidfd = _peer(conn, pending.accepted)
        except Exception as exc:  # malformed, refused, or out of fds for the pidfd
            self._reply_error(conn, getattr(exc, "code", protocol.INTERNAL), str(exc))
            conn.close()
            return
        try:
            self._admit(uid)
        except Refused as exc:
            log.warning("pid %d (uid %d) refused: %s", pid, uid, exc)
            os.close(pidfd)
            self._reply_error(conn, exc.code, str(exc))
            conn.close()
            return
        self._requests[fd] = _Request(conn, pid, uid, pidfd, hello)
        self._planner.submit(fd, uid, pid, hello.gil_enabled)

    def _live_rings(self, uid: int) -> int:
        """Rings handed to ``uid`` that still exist (a client may keep one after re-registering)."""
        ids = self._rings.get(uid, set())
        ids.difference_update([i for i in ids if not map_alive(i)])
        if not ids:
            self._rings.pop(uid, None)
        return len(ids)

    def _admit(self, uid: int) -> None:
        """Refuse a registration over ``uid``'s quota or the collector's limit of live rings
        (rings are checked alive only when a count reaches its limit)."""
        requests = sum(r.uid == uid for r in self._requests.values())
        mine = len(self._rings.get(uid, ())) + requests
        if mine >= self.max_per_uid:
            mine = self._live_rings(uid) + requests
        if mine >= self.max_per_uid:
            raise Refused(
                protocol.TOO_MANY_PROCESSES,
                f"uid {uid} holds {mine} GIL rings or registrations already (--max-processes-per-uid "
                f"{self.max_per_uid}); a process that re-registers should close its old ring",
            )
        total = sum(map(len, self._rings.values())) + len(self._requests)
        if total >= self.tracer.max_processes:
            total = sum(self._live_rings(u) for u in list(self._rings)) + len(self._requests)
        if total >= self.tracer.max_processes:
            raise Refused(
                protocol.TOO_MANY_PROCESSES,
                f"collector traces {self.tracer.max_processes} processes already (--max-processes)",
            )

    def _planned(self, fd: int, outcome: Outcome) -> None:
        """A worker's answer for the request on connection ``fd``: attach and reply, or refuse."""
        request = self._requests.pop(fd, None)
        if request is None:
            return
        try:
            if isinstance(outcome, Exception):
                raise outcome
            client = self._register(request, outcome)
        except Exception as exc:  # a precise reply for the client, a line for the operator
            code = getattr(exc, "code", protocol.INTERNAL)
            if code == protocol.INTERNAL:
                log.error("registration of pid %d failed: %s", request.pid, exc, exc_info=not isinstance(exc, probes.UnsupportedProcess))
            elif code == protocol.ATTACH_FAILED:  # the collector's privileges, say: the operator's to fix
                log.warning("pid %d (uid %d) refused: %s", request.pid, request.uid, exc)
            os.close(request.pidfd)
            self._reply_error(request.conn, code, str(exc))
            request.conn.close()
            return
        self._clients[client.pid] = client
        self._sel.register(client.pidfd, selectors.EVENT_READ, lambda _: self._drop(client.pid, "exited"))
        self._sel.register(client.conn, selectors.EVENT_READ, lambda c: self._client_readable(client.pid, c))

    def _register(self, request: _Request, plan: probes.ProbePlan) -> _Client:
        pid, uid, conn = request.pid, request.uid, request.conn
        if pid in self._clients:
            self._drop(pid, "registered again")
        if not _alive(request.pidfd):
            raise Refused(protocol.PROCESS_GONE, f"pid {pid} exited during its registration")
        try:
            traced = self.tracer.add(pid, plan, request.hello.long_wait_ns, request.hello.convoy_ns)
        except OSError as exc:
            raise Refused(protocol.ATTACH_FAILED, f"attaching probes failed: {exc}") from None
        try:
            ring_id = map_id(traced.slots.fd)
        except OSError:
            self.tracer.remove(pid)
            raise
        if not _alive(request.pidfd):  # alive now: the pid was the peer's while probes were attached
            self.tracer.remove(pid)
            raise Refused(protocol.PROCESS_GONE, f"pid {pid} exited during its registration")
        log.info("pid %d (uid %d) registered: %s (take_gil by %s)", pid, uid, plan.interpreter, plan.located_by)
        if plan.no_locations:
            log.info("pid %d: its GIL holds carry no code location: %s", pid, plan.no_locations)
        try:
            protocol.send(
                conn,
                {"ok": True, "size": traced.slots.size, "nslots": self.tracer.nslots, "interpreter": plan.interpreter},
                (traced.slots.fd,),
            )
        except OSError:
            self.tracer.remove(pid)
            raise Refused(protocol.PROCESS_GONE, f"pid {pid} hung up during registration") from None
        self._rings.setdefault(uid, set()).add(ring_id)
        return _Client(pid, uid, conn, request.pidfd, traced)

    def _client_readable(self, pid: int, conn: socket.socket) -> None:
        try:
            data = conn.recv(protocol.MAX_MESSAGE)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(pid, "hung up")
        # Registered clients have nothing more to say; anything else is ignored.

    def _drop(self, pid: int, why: str) -> None:
        client = self._clients.pop(pid, None)
        if client is None:
            return
        self._sel.unregister(client.pidfd)
        self._sel.unregister(client.conn)
        os.close(client.pidfd)
        client.conn.close()
        self.tracer.remove(pid)
        log.info("pid %d %s: probes detached after %.1f s", pid, why, time.monotonic() - client.since)

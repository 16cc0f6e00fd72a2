"""The registration socket: who is asking (SO_PEERCRED, never the message), what to
probe in that process, and tracing it until it exits or hangs up."""

from __future__ import annotations

import logging
import os
import selectors
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Optional

from otel_gil_collector import probes
from otel_gil_collector.tracer import Traced, Tracer
from otel_gil import protocol

log = logging.getLogger("otel_gil.collector")

SO_PEERPIDFD = getattr(socket, "SO_PEERPIDFD", 77)  # Linux >= 6.5
HELLO_TIMEOUT_S = 5.0
MAX_PENDING = 1024
MAX_PENDING_PER_UID = 16  # one user's silent connections cannot lock others out
LONG_WAIT_NS = (50_000, 10_000_000_000)  # accepted range of a client's threshold
CONVOY_NS = (1_000, 10_000_000_000)
_TICK_S = 0.1


@dataclass
class _Pending:
    conn: socket.socket
    uid: int
    deadline: float


@dataclass
class _Client:
    pid: int
    uid: int
    conn: socket.socket
    pidfd: int
    traced: Traced
    since: float = field(default_factory=time.monotonic)


def _peercred(conn: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the peer as the kernel recorded them at connect()."""
    pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return pid, uid


def _peer(conn: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, pidfd) of the peer, from the kernel: nothing the client says counts."""
    pid, uid = _peercred(conn)
    try:
        pidfd = struct.unpack("i", conn.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD, 4))[0]
    except OSError:
        pidfd = os.pidfd_open(pid)  # older kernels: racy only if the pid was reused already
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
    """Single-threaded: every message is one datagram, so no client can stall the loop."""

    def __init__(self, path: str, tracer: Tracer, mode: int = 0o666, group: Optional[int] = None) -> None:
        self.path = path
        self.tracer = tracer
        self._sel = selectors.DefaultSelector()
        self._pending: dict[int, _Pending] = {}
        self._clients: dict[int, _Client] = {}  # by pid
        self._running = True
        self._listener = self._listen(path, mode, group)
        self._sel.register(self._listener, selectors.EVENT_READ, self._accept)

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
            self._tick()

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
                log.warning("dropping a connection that sent no hello within %.0f s", HELLO_TIMEOUT_S)
                self._close_pending(fd)
        self.tracer.finish_bootstrap()

    def _accept(self, listener: socket.socket) -> None:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        uid = _peercred(conn)[1]
        if len(self._pending) >= MAX_PENDING or sum(p.uid == uid for p in self._pending.values()) >= MAX_PENDING_PER_UID:
            log.warning("uid %d has too many connections waiting for a hello; refusing one", uid)
            conn.close()
            return
        conn.setblocking(False)
        self._pending[conn.fileno()] = _Pending(conn, uid, time.monotonic() + HELLO_TIMEOUT_S)
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
        del self._pending[fd]
        try:
            client = self._register(conn, msg)
        except Exception as exc:  # a precise reply for the client, a line for the operator
            code = getattr(exc, "code", protocol.INTERNAL)
            if code == protocol.INTERNAL:
                log.exception("registration failed")
            self._reply_error(conn, code, str(exc))
            conn.close()
            return
        self._clients[client.pid] = client
        self._sel.register(client.pidfd, selectors.EVENT_READ, lambda _: self._drop(client.pid, "exited"))
        self._sel.register(conn, selectors.EVENT_READ, lambda c: self._client_readable(client.pid, c))

    def _register(self, conn: socket.socket, msg: dict) -> _Client:
        hello = parse_hello(msg)
        pid, uid, pidfd = _peer(conn)
        try:
            if pid in self._clients:
                self._drop(pid, "registered again")
            if len(self.tracer.traced) >= self.tracer.max_processes:
                raise probes.UnsupportedProcess(
                    protocol.TOO_MANY_PROCESSES,
                    f"collector traces {self.tracer.max_processes} processes already (--max-processes)",
                )
            plan = probes.plan(pid, gil_enabled=hello.gil_enabled)
            try:
                traced = self.tracer.add(pid, plan, hello.long_wait_ns, hello.convoy_ns)
            except OSError as exc:
                raise probes.UnsupportedProcess(protocol.ATTACH_FAILED, f"attaching probes failed: {exc}") from None
            log.info("pid %d (uid %d) registered: %s (take_gil by %s)", pid, uid, plan.interpreter, plan.located_by)
            try:
                protocol.send(
                    conn,
                    {"ok": True, "size": traced.slots.size, "nslots": self.tracer.nslots, "interpreter": plan.interpreter},
                    (traced.slots.fd,),
                )
            except OSError:
                self.tracer.remove(pid)
                raise probes.UnsupportedProcess(protocol.PROCESS_GONE, f"pid {pid} hung up during registration") from None
        except BaseException:
            os.close(pidfd)
            raise
        return _Client(pid, uid, conn, pidfd, traced)

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

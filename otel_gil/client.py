"""Registration with the collector, kept alive across collector restarts and fork().

A daemon thread connects, says hello, maps the ring it gets back, then blocks
on the socket: end-of-file means the collector went away, so it retries with
backoff. Nothing here runs on a request's path; the span hooks only read
``Registration.state``.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import sys
import threading
import time
from typing import NamedTuple, Optional

from otel_gil import protocol
from otel_gil.environment_variables import DEFAULT_SOCKET, OTEL_GIL_SOCKET
from otel_gil.ring import LayoutError, Ring
from otel_gil.semconv import (GIL_DISABLED, GIL_NOT_LOCATED, INTERNAL, NO_COLLECTOR, PENDING, REGISTERED,
                              UNSUPPORTED_INTERPRETER, UNSUPPORTED_VERSION)

log = logging.getLogger("otel_gil")

_PERMANENT = {UNSUPPORTED_INTERPRETER, GIL_DISABLED, UNSUPPORTED_VERSION}
_REPLY_TIMEOUT_S = 30.0
_BACKOFF_S = (0.5, 30.0)
_BUSY_RETRY_S = 0.05
_LOCATE_TIMEOUT_S = 0.5  # hand-offs for the probes to learn the GIL from, before saying they cannot


def gil_enabled() -> bool:
    """False on a free-threaded build running without its GIL (3.13+)."""
    is_enabled = getattr(sys, "_is_gil_enabled", None)
    return True if is_enabled is None else bool(is_enabled())


_generations = itertools.count(1)  # one sequence for every backend: a new one's first never equals an old one's


class State(NamedTuple):
    """A backend's ring and what it means, replaced whole: one read gives a ring with its own status."""

    ring: Optional[Ring]  # None unless status is REGISTERED
    status: str  # REGISTERED, or the gil.status of spans (semconv.STATUSES)
    detail: str  # why, for the log
    generation: int  # new at every change, unique in the process (in-process: also in a forked child): cached slot indexes expire


class RingState:
    """What span hooks and metrics read from a backend: ``state``, read once per use."""

    def __init__(self) -> None:
        self.state = State(None, PENDING, "", 0)

    def _publish(self, ring: Optional[Ring], status: str, detail: str) -> None:
        """Replace the state, in one assignment. The old ring is released only after it: a
        ring's release runs Python code (munmap through ctypes), so other threads run then."""
        old = self.state
        self.state = State(ring, status, detail, next(_generations))
        del old


class Registration(RingState):
    """This process's link to the collector.

    ``fallback`` (auto backend): a writer of this process's own (the in-process backend) to
    trace with while the collector is gone; its ring is published in the collector's place
    until the process registers again, then it stops (never both on one ring)."""

    kind = "collector"

    def __init__(self, socket_path: Optional[str] = None, long_wait_ns: int = 1_000_000, fallback=None) -> None:
        super().__init__()
        self.fallback = fallback
        self._fallen_back = False
        self.socket_path = socket_path or os.environ.get(OTEL_GIL_SOCKET) or DEFAULT_SOCKET
        self.long_wait_ns = long_wait_ns
        self.quiet = False  # True while backend.start() only asks whether a collector answers
        self._logged: set[str] = set()
        self._lock = threading.Lock()
        self._settled = threading.Event()
        self._stop = threading.Event()
        self._sock: Optional[socket.socket] = None
        self._thread: Optional[threading.Thread] = None
        self._pid = os.getpid()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._after_fork)

    def start(self) -> None:
        """Start registering (once; not after stop())."""
        if self._thread is None and not self._stop.is_set():
            self._thread = threading.Thread(target=self._run, name="otel-gil-registrar", daemon=True)
            self._thread.start()

    def wait(self, timeout: float) -> bool:
        """Block until the first attempt ended (registered or not); False on timeout."""
        return self._settled.wait(timeout)

    def stop(self) -> None:
        self._stop.set()
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._set(None, PENDING, "")
        if self._fallen_back:
            self.fallback.stop()
            self._fallen_back = False

    def check_fork(self) -> None:
        """Span hooks call this: a child of a fork made by C code (uWSGI's workers) ran no
        at-fork hook, it runs now; and a forked child starts registering, on its first span."""
        if os.getpid() != self._pid:
            self._after_fork()
        if self._thread is None:
            self.start()

    def _after_fork(self) -> None:
        """The child has the parent's socket and ring but not its thread, and a new pid. It
        pays nothing now: it registers when it makes its first span (spans say ``pending``
        until then), so children that make none (multiprocessing, ForkingMixIn) never do."""
        self._pid = os.getpid()
        self._lock = threading.Lock()
        if self._sock is not None:
            self._sock.close()  # only the child's copy: the parent's connection stays up
            self._sock = None
        self._set(None, PENDING, "")
        self._settled = threading.Event()
        self._thread = None

    def _set(self, ring: Optional[Ring], status: str, detail: str) -> None:
        if status == NO_COLLECTOR and self.fallback is not None and not self._stop.is_set():
            ring, status, detail = self._fall_back(detail)
        elif ring is not None and self._fallen_back:  # the collector is back: it traces, the fallback stops
            self.fallback.stop()
            self._fallen_back = False
            log.info("otel-gil: the collector is back; its figures from now on")
        with self._lock:
            self._publish(ring, status, detail)
        if status != REGISTERED and status not in self._logged and status != PENDING and not self.quiet:
            self._logged.add(status)
            log.warning("otel-gil: no GIL figures (%s): %s", status, detail)

    def _fall_back(self, why: str) -> tuple[Optional[Ring], str, str]:
        """The fallback's ring, started if need be, or (None, NO_COLLECTOR, why) where it has none."""
        if not self._fallen_back:
            self.fallback.start()
        state = self.fallback.state
        if state.ring is None:
            return None, NO_COLLECTOR, f"{why}; tracing in-process failed too: {state.detail}"
        if not self._fallen_back:
            self._fallen_back = True
            log.warning("otel-gil: %s: tracing in-process until it is back", why)
        return state.ring, REGISTERED, ""

    def _run(self) -> None:
        delay = _BACKOFF_S[0]
        while not self._stop.is_set():
            permanent = self._attempt()
            self._settled.set()
            if permanent or self._stop.is_set():
                return
            if self._sock is not None:  # registered (the status may be a fallback's)
                self._hold_connection()
                delay = _BACKOFF_S[0]
                continue
            self._stop.wait(delay)
            delay = min(delay * 2, _BACKOFF_S[1])

    def _attempt(self) -> bool:
        """One registration; True when retrying cannot help."""
        if not gil_enabled():
            self._set(None, GIL_DISABLED, "this interpreter runs without a GIL (free-threaded build)")
            return True
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sock.settimeout(_REPLY_TIMEOUT_S)
        try:
            self._connect(sock)
            protocol.send(
                sock,
                {
                    "op": "hello",
                    "python": sys.version.split()[0],
                    "executable": sys.executable[:256],
                    "long_wait_ns": self.long_wait_ns,
                    "convoy_ns": int(sys.getswitchinterval() * 1e9),
                    "gil_enabled": True,
                },
            )
            reply, fds = protocol.receive(sock, max_fds=1)
        except (OSError, protocol.ProtocolError) as exc:
            sock.close()
            self._set(None, NO_COLLECTOR, f"cannot register with the collector at {self.socket_path}: {exc}")
            return False
        if not reply.get("ok"):
            sock.close()
            status, detail = protocol.refusal(reply)
            self._set(None, status, detail)
            return status in _PERMANENT
        try:
            if len(fds) != 1 or not isinstance(reply.get("size"), int):
                raise protocol.ProtocolError("ok reply without a ring")
            ring = Ring.map_fd(fds[0], reply["size"])
        except (OSError, LayoutError, protocol.ProtocolError) as exc:
            sock.close()
            self._set(None, INTERNAL, f"cannot map the GIL ring: {exc}")
            return isinstance(exc, LayoutError)
        finally:
            for fd in fds:
                os.close(fd)
        if not _gil_located(ring):
            sock.close()
            self._set(None, GIL_NOT_LOCATED,
                      f"the collector's probes saw no GIL hand-off of this process in {_LOCATE_TIMEOUT_S} s: "
                      "its build calls pthread_cond_* somewhere they do not watch; please report it")
            return True
        self._sock = sock
        self._set(ring, REGISTERED, "")
        log.info("otel-gil: registered with the collector at %s", self.socket_path)
        return False

    def _connect(self, sock: socket.socket) -> None:
        """Connect, waiting while the collector's accept queue is full (it is busy registering others)."""
        deadline = time.monotonic() + _REPLY_TIMEOUT_S
        while True:
            try:
                sock.connect(self.socket_path)
                return
            except BlockingIOError:
                if time.monotonic() > deadline or self._stop.is_set():
                    raise
                time.sleep(_BUSY_RETRY_S)

    def _hold_connection(self) -> None:
        """Block until the collector hangs up (restart, crash), then drop the stale ring."""
        sock = self._sock
        sock.settimeout(None)
        try:
            while sock.recv(protocol.MAX_MESSAGE):
                pass
        except OSError:
            pass
        sock.close()
        self._sock = None
        if not self._stop.is_set():
            self._logged.discard(NO_COLLECTOR)
            self._set(None, NO_COLLECTOR, "the collector went away; re-registering when it is back")


def _gil_located(ring: Ring) -> bool:
    """Whether the GIL's condition variables got learned: each sleep here is a GIL hand-off
    the probes see, so a healthy process is located after the first one."""
    deadline = time.monotonic() + _LOCATE_TIMEOUT_S
    while not ring.header.switch_cond:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True

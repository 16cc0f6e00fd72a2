"""The in-process backend: this process traces its own GIL hand-offs, no root, no collector.

``otel_gil._inprocess`` (C) swaps the interpreter's GOT entries of
``pthread_cond_signal`` and ``pthread_cond_timedwait`` for wrappers that write
the same slot layout as the collector's BPF program, in this process's memory.
:class:`InProcess` has the interface the span hooks and metrics read from any
backend: ``state``.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Optional

from otel_gil import free_threading, pystructs
from otel_gil import ring as ringlib
from otel_gil.client import RingState, gil_enabled
from otel_gil.semconv import GIL_DISABLED, PENDING, REGISTERED, UNSUPPORTED_INTERPRETER, UNSUPPORTED_VERSION

log = logging.getLogger("otel_gil")

try:
    from otel_gil import _inprocess
except ImportError as exc:  # built without a C compiler
    _inprocess = None
    _IMPORT_ERROR = str(exc)

NSLOTS = 2048


class InProcess(RingState):
    """GOT hooks in this process."""

    kind = "inprocess"

    def __init__(self, long_wait_ns: int = 1_000_000, nslots: int = NSLOTS) -> None:
        super().__init__()
        self.long_wait_ns = long_wait_ns
        self.nslots = nslots
        self._pid = os.getpid()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._after_fork)

    def start(self) -> None:
        """Install the hooks (with the GIL held, as every call from Python is)."""
        if self.state.ring is not None:
            return
        if not gil_enabled():
            return self._fail(GIL_DISABLED, "this interpreter runs without a GIL (free-threaded build)")
        if _inprocess is None:
            return self._fail(UNSUPPORTED_INTERPRETER,
                              f"otel_gil._inprocess was not built ({_IMPORT_ERROR}): reinstall otel-gil where a C "
                              "compiler and Python.h are present, or use the collector (OTEL_GIL_BACKEND=collector)")
        if (_inprocess.LAYOUT_VERSION, _inprocess.SLOT_SIZE) != (ringlib.LAYOUT_VERSION, ringlib.SLOT_SIZE):
            return self._fail(UNSUPPORTED_VERSION,
                              "otel_gil._inprocess was built for another ring layout: reinstall otel-gil")
        try:
            address, size = _inprocess.install(self.nslots, self.long_wait_ns, int(sys.getswitchinterval() * 1e9))
        except (_inprocess.Unsupported, OSError) as exc:
            return self._fail(UNSUPPORTED_INTERPRETER, f"{exc}; the collector may trace it (OTEL_GIL_BACKEND=collector)")
        self._publish(ringlib.Ring(address, size), REGISTERED, "")
        log.info("otel-gil: tracing the GIL in-process (GOT hooks in %s)", _inprocess.object())
        problem = _locate_through(pystructs.py_layout(sys.version_info[:2], 0, 0, 0, free_threading.free_threaded()))
        if problem:
            log.warning("otel-gil: GIL holds carry no code location (gil.blocker.code.*): %s", problem)

    def wait(self, timeout: float) -> bool:
        return True  # start() is synchronous

    def stop(self) -> None:
        if _inprocess is not None and self.state.ring is not None:
            _inprocess.uninstall()
        self._publish(None, PENDING, "")

    def _fail(self, status: str, detail: str) -> None:
        self._publish(None, status, detail)
        log.warning("otel-gil: no GIL figures (%s): %s", status, detail)

    def check_fork(self) -> None:
        if os.getpid() != self._pid:
            self._after_fork()

    def _after_fork(self) -> None:
        # The C side started the ring afresh for the child (same address); thread ids changed.
        self._pid = os.getpid()
        state = self.state
        self._publish(state.ring, state.status, state.detail)


def _locate_through(layout: ringlib.PyLayout) -> Optional[str]:
    """Logged holds record their code location through ``layout`` if it reads this very
    interpreter right: on 3.13+ its own _Py_DebugOffsets agree, and this thread's frames,
    read through it with reads that fail instead of faulting, are what Python says they
    are. Else none is recorded (every location says ``no_layout``); returns why."""
    problem = _layout_problem(layout)
    _inprocess.set_layout(bytes(ringlib.PyLayout() if problem else layout))
    return problem


def _layout_problem(layout: ringlib.PyLayout) -> Optional[str]:
    free_threaded = free_threading.free_threaded()
    structs = pystructs.for_version(sys.version_info[:2], free_threaded)
    if structs is None or not layout.minor:
        build = pystructs.build_name(sys.version_info[:2], free_threaded)
        return f"no struct offsets for {build} (otel_gil/pystructs.py)"
    if hasattr(sys, "gettotalrefcount"):
        return "a debug build (its objects are laid out otherwise)"
    runtime = pystructs.own_runtime()
    if structs.debug and runtime is not None:
        disagreement = pystructs.debug_offsets_disagree(structs, lambda at, size: pystructs.read_own(runtime + at, size))
        if disagreement:
            return disagreement
    record, frame, line = _inprocess.locate_self(bytes(layout)), sys._getframe(), sys._getframe().f_lineno
    seen = ringlib.location_of(ringlib.LocationRecord.from_buffer_copy(record))
    expected = []
    while frame is not None and len(expected) < len(seen.frames):
        code = frame.f_code
        expected.append(ringlib.Frame(getattr(code, "co_qualname", code.co_name), code.co_filename, line))
        frame = frame.f_back
        line = frame.f_lineno if frame is not None else 0
    if not seen.frames or seen.missing or list(seen.frames) != expected:
        return f"reading this thread's frames gave {seen}, Python says {expected}"
    return None

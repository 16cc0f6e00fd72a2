"""A free-threaded build's GIL (3.13t+): off, on from the start (``PYTHON_GIL=1``, ``-X gil=1``),
or turned on for good, mid-run, by importing an extension that does not declare ``Py_mod_gil``.

While it is off there is no GIL to measure: :class:`UntilGilOn` stands in for the backend
(spans say ``gil.status=gil_disabled``) and watches extension imports, where CPython decides
(``ExtensionFileLoader.create_module``), and every span start (``state``: one call), for a GIL
turned on otherwise (``_imp.create_dynamic``, a loader of its own). The import only records
the switch (the module, the time); a thread of ours logs it and starts the real backend, off the
app's path (spans that start meanwhile say ``pending``): spans that start after it carry exact
figures; a span in flight across the switch says ``gil.status=gil_turned_on`` and carries a
``gil.enabled`` event naming the module, at the time it did.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import sysconfig
import threading
import time
from importlib.machinery import ExtensionFileLoader
from typing import Callable, NamedTuple, Optional

from otel_gil import pystructs, wrappers
from otel_gil.client import State, gil_enabled
from otel_gil.semconv import GIL_DISABLED, GIL_ENABLED, GIL_ENABLED_BY, PENDING

log = logging.getLogger("otel_gil")

_FOR_GOOD = 2**31 - 1  # struct _gil_runtime_state.enabled once the GIL is on for good (INT_MAX)


def free_threaded() -> bool:
    """This interpreter is a free-threaded build (its GIL may be off)."""
    return bool(sysconfig.get_config_var("Py_GIL_DISABLED"))


def gil_on_for_good() -> bool:
    """The GIL is on and stays on. ``sys._is_gil_enabled()`` is also true while an import of
    another thread turned it on for a while (CPython does, to run a module's init), so where
    this CPython's ``_Py_DebugOffsets`` say where, the GIL's own ``enabled`` count is read:
    INT_MAX once it is on for good. Where they do not, on is taken for good (README,
    "Free-threaded builds", "When the GIL comes back")."""
    if not gil_enabled():
        return False
    count = _enabled_count()
    return count is None or count == _FOR_GOOD


def _enabled_count() -> Optional[int]:
    """``struct _gil_runtime_state.enabled`` of the main interpreter, None where it cannot be found."""
    global _enabled_at
    if _enabled_at is None:
        runtime = pystructs.own_runtime()
        found = runtime and pystructs.gil_enabled_address(sys.version_info[:2], runtime, pystructs.read_own)
        _enabled_at = found or 0
    return ctypes.c_int.from_address(_enabled_at).value if _enabled_at else None


_enabled_at: Optional[int] = None  # where _enabled_count reads (0: nowhere), found once


class TurnedOn(NamedTuple):
    """What turned the GIL on: the import's module and file ("" where it was not an import we
    watch), when (wall clock ns)."""

    module: str
    path: str
    wall_ns: int


def enabled_by(turned_on: TurnedOn) -> dict:
    """The ``gil.enabled`` event's and gauge's attributes: the module, where one is known."""
    return {GIL_ENABLED_BY: turned_on.module} if turned_on.module else {}


def event(turned_on: TurnedOn) -> tuple[str, dict, int, int]:
    """The ``gil.enabled`` event of a span in flight when ``turned_on`` happened (as ``spans.figures`` lists events)."""
    return GIL_ENABLED, enabled_by(turned_on), turned_on.wall_ns, turned_on.wall_ns


class UntilGilOn:
    """The backend of a free-threaded process running without its GIL: ``gil_disabled`` until
    the GIL is turned on, then (``pending`` meanwhile) the backend ``start()`` returns, which it
    stands for, started by a thread of ours.

    ``turned_on``: what turned it on, once it happened."""

    def __init__(self, kind: str, start: Callable[[], object]) -> None:
        self._kind = kind
        self._start = start
        self._state = State(None, GIL_DISABLED, "this interpreter runs without a GIL (free-threaded build)", 0)
        self._real = None
        self._lock = threading.Lock()  # start and stop: one at a time
        self._stopped = False
        self._turning = threading.Lock()  # turned_on: set once
        self.turned_on: Optional[TurnedOn] = None
        self._go, self._started = threading.Event(), threading.Event()
        self._starter = self._spawn()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._after_fork)
        global _watching
        _watching = self
        wrappers.wrap(ExtensionFileLoader, "create_module", _create_module)

    @property
    def kind(self) -> str:
        real = self._real
        return self._kind if real is None else real.kind

    @property
    def state(self) -> State:
        """Read at every span start: while the GIL is off, one call says so."""
        real = self._real
        if real is not None:
            return real.state
        if self.turned_on is None and _is_gil_enabled() and gil_on_for_good():
            self._turn_on("", "")  # not by an import we watch
        return self._state

    def check_fork(self) -> None:
        real = self._real
        if real is not None:
            real.check_fork()

    def wait(self, timeout: float) -> bool:
        """Until the backend started at the GIL's turning on says whether figures flow (False:
        not within ``timeout`` s, or the GIL is still off)."""
        deadline = time.monotonic() + timeout
        if not self._started.wait(timeout):
            return False
        real = self._real
        return real is not None and real.wait(max(deadline - time.monotonic(), 0))

    def stop(self) -> None:
        global _watching
        if _watching is self:
            _watching = None
            wrappers.unwrap(ExtensionFileLoader, "create_module", _create_module)
        with self._lock:  # after a start in progress, which then started something to stop
            self._stopped = True
            real = self._real
        self._go.set()  # the starter ends
        if real is not None:
            real.stop()

    def _turn_on(self, module: str, path: str) -> None:
        """The GIL is on for good (``module``'s import turned it on, where one is named): record it
        (spans in flight see it) and wake the starter. Runs on the app's path: nothing more."""
        with self._turning:
            if self.turned_on is not None:
                return
            self.turned_on = TurnedOn(module, path, time.time_ns())
            self._state = State(None, PENDING, "starting to measure the GIL, which was turned on", 1)
        self._go.set()

    def _spawn(self) -> threading.Thread:
        starter = threading.Thread(target=self._run, name="otel-gil-gil-on", daemon=True)
        starter.start()
        return starter

    def _run(self) -> None:
        """The starter: waits for the GIL to be turned on (or stop()), says so, starts measuring."""
        self._go.wait()
        try:
            with self._lock:
                turned_on = self.turned_on
                if self._stopped or turned_on is None or self._real is not None:
                    return
                when = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(turned_on.wall_ns / 1e9))
                what = f"importing {turned_on.module} ({turned_on.path})" if turned_on.module else \
                    "something other than an extension import otel-gil watches (_imp.create_dynamic, a loader of its own)"
                log.warning("otel-gil: %s turned the GIL of this free-threaded build on, at %s.%03dZ%s; GIL figures "
                            "from now on", what, when, turned_on.wall_ns // 1_000_000 % 1000,
                            ": it does not declare Py_mod_gil" if turned_on.module else " (seen then)")
                self._real = self._start()
        except Exception:  # never break the app: spans stay pending
            log.exception("otel-gil: starting to measure the GIL that was turned on failed")
        finally:
            self._started.set()

    def _after_fork(self) -> None:
        """A forked child has none of the parent's threads: a starter (and locks) of its own."""
        self._lock, self._turning = threading.Lock(), threading.Lock()
        self._go, self._started = threading.Event(), threading.Event()
        if self._real is not None:
            self._started.set()
        elif not self._stopped:
            if self.turned_on is not None:
                self._go.set()
            self._starter = self._spawn()


_watching: Optional[UntilGilOn] = None
_is_gil_enabled: Callable[[], bool] = getattr(sys, "_is_gil_enabled", lambda: True)  # one call per span start


def _create_module(wrapped, instance, args, kwargs):
    """``wrapt`` wrapper of ``ExtensionFileLoader.create_module``: CPython turns the GIL on there."""
    watching = _watching
    if watching is None or watching.turned_on is not None or gil_on_for_good():
        return wrapped(*args, **kwargs)
    try:
        return wrapped(*args, **kwargs)
    finally:  # also when it failed: the GIL is on before the warning that -W error makes an ImportError
        try:
            if gil_on_for_good():
                spec = args[0] if args else kwargs["spec"]
                watching._turn_on(spec.name, spec.origin or "")
        except Exception:  # never break the app's import
            log.exception("otel-gil: recording that an import turned the GIL on failed")

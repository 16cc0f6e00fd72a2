"""A free-threaded build's GIL (3.13t+): off, on from the start (``PYTHON_GIL=1``, ``-X gil=1``),
or turned on for good, mid-run, by importing an extension that does not declare ``Py_mod_gil``.

While it is off there is no GIL to measure: :class:`UntilGilOn` stands in for the backend
(spans say ``gil.status=gil_disabled``) and watches extension imports, where CPython decides
(``ExtensionFileLoader.create_module``). The import that turns the GIL on for good is logged by
name, and the real backend starts then, inside that import: spans that start after it carry
exact figures; a span in flight across it says ``gil.status=gil_turned_on`` and carries a
``gil.enabled`` event naming the module, at the time it did.
"""

from __future__ import annotations

import ctypes
import logging
import sys
import sysconfig
import threading
import time
from importlib.machinery import ExtensionFileLoader
from typing import Callable, NamedTuple, Optional

from otel_gil import pystructs, wrappers
from otel_gil.client import State, gil_enabled
from otel_gil.semconv import GIL_DISABLED, GIL_ENABLED, GIL_ENABLED_BY

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
    address = enabled_address()
    return None if address is None else ctypes.c_int.from_address(address).value


def enabled_address() -> Optional[int]:
    """Where ``struct _gil_runtime_state.enabled`` of the main interpreter is, None where it cannot be found."""
    positions = pystructs.GIL_ENABLED_DEBUG.get(sys.version_info[:2])
    try:
        runtime = ctypes.addressof(ctypes.c_char.in_dll(ctypes.pythonapi, "_PyRuntime"))
    except ValueError:  # not exported
        return None

    def u64(address: int) -> int:
        return ctypes.c_uint64.from_address(address).value

    if positions is None or ctypes.string_at(runtime, len(pystructs.DEBUG_COOKIE)) != pystructs.DEBUG_COOKIE or \
            not u64(runtime + pystructs.DEBUG_FREE_THREADED):
        return None
    interpreters_head, ceval_gil, enabled = (u64(runtime + position) for position in positions)
    return u64(u64(runtime + interpreters_head) + ceval_gil) + enabled


class TurnedOn(NamedTuple):
    """The import that turned the GIL on: the module's name, its file, when (wall clock ns)."""

    module: str
    path: str
    wall_ns: int


def event(turned_on: TurnedOn) -> tuple[str, dict, int, int]:
    """The ``gil.enabled`` event of a span in flight when ``turned_on`` happened (as ``spans.figures`` lists events)."""
    return GIL_ENABLED, {GIL_ENABLED_BY: turned_on.module}, turned_on.wall_ns, turned_on.wall_ns


class UntilGilOn:
    """The backend of a free-threaded process running without its GIL: ``gil_disabled`` until
    an import turns the GIL on, then the backend ``start()`` returns, which it stands for.

    ``turned_on``: that import, once it happened."""

    def __init__(self, kind: str, start: Callable[[], object]) -> None:
        self._kind = kind
        self._start = start
        self._state = State(None, GIL_DISABLED, "this interpreter runs without a GIL (free-threaded build)", 0)
        self._real = None
        self._lock = threading.Lock()
        self.turned_on: Optional[TurnedOn] = None
        global _watching
        _watching = self
        wrappers.wrap(ExtensionFileLoader, "create_module", _create_module)

    @property
    def kind(self) -> str:
        real = self._real
        return self._kind if real is None else real.kind

    @property
    def state(self) -> State:
        real = self._real
        return self._state if real is None else real.state

    def check_fork(self) -> None:
        real = self._real
        if real is not None:
            real.check_fork()

    def stop(self) -> None:
        global _watching
        if _watching is self:
            _watching = None
            wrappers.unwrap(ExtensionFileLoader, "create_module", _create_module)
        real = self._real
        if real is not None:
            real.stop()

    def _turn_on(self, module: str, path: str) -> None:
        """``module``'s import turned the GIL on for good: say so once, and start measuring."""
        with self._lock:
            if self.turned_on is not None:
                return
            self.turned_on = TurnedOn(module, path, time.time_ns())  # before the backend: spans in flight see it
        when = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(self.turned_on.wall_ns / 1e9))
        log.warning("otel-gil: importing %s (%s) turned the GIL of this free-threaded build on, at %s.%03dZ: it "
                    "does not declare Py_mod_gil; GIL figures from now on", module, path, when,
                    self.turned_on.wall_ns // 1_000_000 % 1000)
        self._real = self._start()


_watching: Optional[UntilGilOn] = None


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
            log.exception("otel-gil: starting to measure the GIL an import turned on failed")

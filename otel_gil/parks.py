"""Parked time on spans: what each thread of a free-threaded build running without its GIL
waited on inside the interpreter (README, "Free-threaded builds", "Parked time").

``_inprocess.install_parks`` hooks libpython's ``sem_*`` calls, through which a thread parks in
CPython's parking lot, and writes each park into the thread's slot by kind (gil_layout.h,
``GIL_PARK_*``): stop-the-world, an object's critical section (with its type), the app's locks,
the interpreter's internal locks, the rest. :func:`start` installs it while the GIL is off; the
span hooks take :func:`snapshot` at a span's start and :func:`figures` at its end.

On an event loop or a greenlet hub a thread's parks are whichever request's code ran: there
``_parkcontexts`` (park_contexts.c) charges them to the span whose code ran, at every switch of
context (``contexts``); without it such spans carry none.
"""

from __future__ import annotations

import _thread
import contextvars
import ctypes
import logging
import sys
import threading
import time
from typing import NamedTuple, Optional

from opentelemetry import context as otel_context
from opentelemetry.trace import propagation as trace_propagation

from otel_gil import free_threading, pystructs
from otel_gil import ring as ringlib
from otel_gil.client import gil_enabled
from otel_gil.semconv import (PARK, PARK_KIND, PARK_KINDS, PARK_MS, PARK_TYPE, PARKED_MS, PARKED_TOP_TYPE,
                              PARKED_TOP_TYPE_MS, PARKED_TOTAL_MS, PARKS, PARKS_DROPPED)

log = logging.getLogger("otel_gil")

try:
    from otel_gil import _inprocess
except ImportError:  # built without a C compiler: no parks (the GIL backend says why)
    _inprocess = None
try:
    from otel_gil import _parkcontexts
except ImportError:  # a default build (its GIL figures follow contexts), or no C compiler
    _parkcontexts = None

_local = threading.local()


class Parked(NamedTuple):
    """One thread's parked figures at a monotonic time (an open park closed then)."""

    mono_ns: int
    parked_ns: tuple[int, ...]  # by kind (ringlib.PARK_*)
    parks: int
    long_parks: int


class LongPark(NamedTuple):
    start_ns: int
    end_ns: int
    kind: int
    type: str


class Parks:
    """The ring the park hooks write, and this thread's slot in it."""

    def __init__(self, ring: ringlib.Ring) -> None:
        self.ring = ring
        self.convoy_ns = ring.header.convoy_ns
        self.long_wait_ns = ring.header.long_wait_ns

    def read(self) -> tuple[Parked, Optional[ringlib.Slot]]:
        """The calling thread's figures now, and the slot they were read from (None: no park yet).
        The clock is read again until no park of this thread (a move of its slot's seq: a
        stop-the-world may suspend it between two bytecodes) came between it and the copy.
        Raises BusySlot if none came out consistent."""
        tid, now = threading.get_native_id(), time.monotonic_ns()
        index = self.ring.find(tid, getattr(_local, "hint", -1))
        if index < 0:  # no park by then (the clock read first: a first park after it claims a slot)
            return Parked(now, (0,) * ringlib.PARK_KINDS, 0, 0), None
        _local.hint = index
        live = self.ring.slot(index)
        for _ in range(ringlib.SNAPSHOT_TRIES):
            seq = live.seq
            now = time.monotonic_ns()
            slot = self.ring.snapshot(index)
            if slot.seq == seq:
                break
        else:
            raise ringlib.BusySlot(f"slot {index} moved between every clock read and copy")
        if slot.tid != tid:
            return Parked(now, (0,) * ringlib.PARK_KINDS, 0, 0), None
        parked = list(slot.parked_ns)
        if slot.park_start_ns and now > slot.park_start_ns:  # open: closed at now
            parked[min(slot.park_kind, ringlib.PARK_OTHER)] += now - slot.park_start_ns
        return Parked(now, tuple(parked), slot.parks, slot.long_parks), slot


current: Optional[Parks] = None  # installed by start(), while the GIL is off
contexts = False  # parks charged to the span whose code ran, at every switch of context (_parkcontexts)


def start(long_wait_ns: int, nslots: int = 2048) -> Optional[Parks]:
    """Hook parks in this process if it is a free-threaded build running without its GIL and
    its CPython has a row in ``pystructs.PARKING``; None (and why, in the log) if not."""
    global current
    if current is not None or not free_threading.free_threaded() or gil_enabled():
        return current
    problem = _unsupported()
    if problem:
        log.warning("otel-gil: no parked time on spans: %s", problem)
        return None
    entry_addr = pystructs.PARKING[sys.version_info[:2]].entry_addr
    try:
        address, size = _inprocess.install_parks(nslots, long_wait_ns, int(sys.getswitchinterval() * 1e9), entry_addr,
                                                 *where(), free_threading.enabled_address())
    except (_inprocess.Unsupported, OSError) as exc:
        log.warning("otel-gil: no parked time on spans: %s", exc)
        return None
    current = Parks(ringlib.Ring(address, size))
    log.info("otel-gil: timing parks in-process (sem_* GOT hooks in %s)", _inprocess.object())
    _follow_contexts(address, nslots)
    return current


def where() -> tuple:
    """What ``install_parks`` tells a park's address apart by (its arguments of these names):
    ``tstate_state, ob_mutex, ob_type, lock_mutex, tp_name, stw_runtime, stw_interp`` of this
    CPython's ``pystructs.PARKING`` row, ``runtime_size, interp_size`` as its runtime says, and
    ``lock_types``, the app's locks."""
    row = pystructs.PARKING[sys.version_info[:2]]
    runtime = ctypes.addressof(ctypes.c_char.in_dll(ctypes.pythonapi, "_PyRuntime"))
    size_at = lambda position: ctypes.c_uint64.from_address(runtime + position).value  # noqa: E731
    return (row.tstate_state, row.ob_mutex, row.ob_type, row.lock_mutex, row.tp_name, row.stw_runtime, row.stw_interp,
            size_at(pystructs.DEBUG_RUNTIME_SIZE), size_at(pystructs.DEBUG_INTERP_SIZE),
            (id(_thread.LockType), id(_thread.RLock)))


def otel_context_var() -> tuple[Optional[contextvars.ContextVar], Optional[str]]:
    """OpenTelemetry's ContextVar of the current context and its current span's key (None, None
    where it keeps them otherwise): what the C charge points read whose code runs."""
    var = getattr(getattr(otel_context, "_RUNTIME_CONTEXT", None), "_current_context", None)
    key = getattr(trace_propagation, "_SPAN_KEY", None)
    if not isinstance(var, contextvars.ContextVar) or not isinstance(key, str):
        return None, None
    return var, key


def _follow_contexts(address: int, nslots: int) -> None:
    global contexts
    var, key = otel_context_var()
    why = ("otel_gil._parkcontexts was not built" if _parkcontexts is None else
           "OpenTelemetry's current context is not kept in a ContextVar here" if var is None else None)
    if why is None:
        try:
            _parkcontexts.track(address, nslots, var, key)
            contexts = True
            return
        except Exception as exc:
            why = f"context switches cannot be followed ({exc})"
    log.warning("otel-gil: %s: spans on event loops and greenlets carry no parked time", why)


def _unsupported() -> Optional[str]:
    if _inprocess is None or not hasattr(_inprocess, "install_parks"):
        return "otel_gil._inprocess was not built for this free-threaded interpreter"
    if sys.version_info[:2] not in pystructs.PARKING:
        return f"no parking offsets for {pystructs.build_name(sys.version_info[:2], True)} (otel_gil/pystructs.py)"
    if free_threading.enabled_address() is None:
        return "where this build keeps whether its GIL is on is unknown (its _Py_DebugOffsets)"
    return None


def stop() -> None:
    """Unhook parks (the ring stays mapped: spans in flight still read it)."""
    global current, contexts
    if contexts:
        _parkcontexts.untrack()
        contexts = False
    if current is not None:
        _inprocess.uninstall_parks()
        current = None


Start = tuple[Parks, Parked, int]  # what snapshot() took, on which thread (native id)


class OwnStart(NamedTuple):
    """What snapshot() took where ``contexts``: the ring parks were hooked into then (its header
    says which parks are long), and the span's own charges (a ``_parkcontexts.Parked``)."""

    parks: Parks
    charges: object


def snapshot(span=None):
    """At a span's start: where ``contexts``, the span's own charges (an :class:`OwnStart`), else
    the calling thread's figures (a :data:`Start`); None: parks are not hooked."""
    parks = current
    if parks is None:
        return None
    if contexts and span is not None:
        parent = span.parent
        return OwnStart(parks, _parkcontexts.start(span, span.context.span_id,
                                                   parent.span_id if parent and not parent.is_remote else 0))
    try:
        return parks, parks.read()[0], threading.get_native_id()
    except ringlib.BusySlot:  # the span goes without parked time
        return None


Figures = tuple[dict, list[tuple[str, dict, int, int]]]


def figures(start, wall_minus_mono: int) -> Figures:
    """A span's parked attributes and ``cpython.park`` events (``(name, attributes, start, end)``,
    wall clock ns) from its start's :func:`snapshot` to now; none for a span that ended on
    another thread than the one whose figures it took."""
    if isinstance(start, OwnStart):
        return _own_figures(start, wall_minus_mono)
    if start is None or start[2] != threading.get_native_id():
        return {}, []
    parks, before, _ = start
    try:
        after, slot = parks.read()
    except ringlib.BusySlot:
        return {}, []
    parked = [a - b for a, b in zip(after.parked_ns, before.parked_ns)]
    if min(parked) < 0 or sum(parked) > after.mono_ns - before.mono_ns:  # not the slot it started with (a fork)
        return {}, []
    longs = [] if slot is None else long_parks(slot, before.long_parks)
    dropped = after.long_parks - before.long_parks - ringlib.PARK_RING_LEN
    return _attributes(parked, after.parks - before.parks, longs, dropped, parks.convoy_ns, wall_minus_mono)


def _own_figures(start: OwnStart, wall_minus_mono: int) -> Figures:
    """A span's own parks, charged at each switch of context (``_parkcontexts.end``): none where a
    switch went unseen or they break the invariants (per thread, parked <= its duration)."""
    own = _parkcontexts.end(start.charges)
    if own is None:
        return {}, []
    by_kind, count, rows, dropped, elapsed, home, elsewhere, others = own
    if home > elapsed or (others >= 0 and elsewhere > elapsed * others):
        return {}, []
    longs = [LongPark(s, e, min(k, ringlib.PARK_OTHER), t.decode("utf-8", "replace")) for s, e, k, t in rows]
    return _attributes(list(by_kind), count, longs, dropped, start.parks.convoy_ns, wall_minus_mono)


def _attributes(parked: list[int], count: int, longs: list[LongPark], dropped: int, convoy_ns: int,
                wall_minus_mono: int) -> Figures:
    """The attributes and events of parked time by kind (ns), ``count`` parks and the long ones."""
    attrs: dict = {key: ns / 1e6 for key, ns in zip(PARKED_MS, parked)}
    attrs[PARKED_TOTAL_MS] = sum(parked) / 1e6
    attrs[PARKS] = count
    if dropped > 0:
        attrs[PARKS_DROPPED] = dropped
    by_type: dict[str, int] = {}
    for p in longs:
        if p.kind == ringlib.PARK_OBJECT:
            by_type[p.type] = by_type.get(p.type, 0) + p.end_ns - p.start_ns
    if by_type:
        top = max(by_type, key=by_type.get)
        attrs[PARKED_TOP_TYPE], attrs[PARKED_TOP_TYPE_MS] = top, by_type[top] / 1e6
    events = []
    for p in longs:
        if p.end_ns - p.start_ns >= convoy_ns:
            event = {PARK_KIND: PARK_KINDS[p.kind], PARK_MS: (p.end_ns - p.start_ns) / 1e6}
            if p.kind == ringlib.PARK_OBJECT:
                event[PARK_TYPE] = p.type
            events.append((PARK, event, p.start_ns + wall_minus_mono, p.end_ns + wall_minus_mono))
    return attrs, events


def long_parks(slot: ringlib.Slot, since: int) -> list[LongPark]:
    """The long parks a slot recorded after its ``since``-th one (those still in its ring), oldest first."""
    first = max(since, slot.long_parks - ringlib.PARK_RING_LEN)
    rows = (slot.park_ring[i % ringlib.PARK_RING_LEN] for i in range(first, slot.long_parks))
    return [LongPark(p.start_ns, p.end_ns, min(p.kind, ringlib.PARK_OTHER), p.type.decode("utf-8", "replace"))
            for p in rows]

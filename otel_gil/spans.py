"""GIL figures on spans: a snapshot of the thread's slot when a span starts, the
difference when it ends, set as attributes and events before the span freezes.

The hooks here are the reference. Where the optional C extension
(``otel_gil/_fastspan.c``) was built, it takes the common case (start and end on
one thread of a registered process, no long wait in the span) at a fraction of
the cost, and hands every other case to these functions.
"""

from __future__ import annotations

import contextvars
import logging
import sys
import threading
import time
from typing import Callable, NamedTuple, Optional

import wrapt
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.trace import SpanKind, format_span_id
from opentelemetry.trace import propagation as trace_propagation

from otel_gil import blame as blamelib
from otel_gil import free_threading, parks
from otel_gil import ring as ringlib
from otel_gil import threads, wait_spans, wrappers
from otel_gil.backend import Backend
from otel_gil.metrics import GilMetrics
from otel_gil.semconv import (COLLECTOR_CHANGED, CROSS_THREAD, END_PASSED, GIL_ACQUISITIONS, GIL_CONVOY_WAITS,
                              GIL_DISABLED, GIL_HOLD_MS, GIL_HOLD_RATIO, GIL_LONG_WAITS_DROPPED, GIL_OTHERS_HOLD_MS,
                              GIL_STATUS, GIL_TURNED_ON, GIL_WAIT, GIL_WAIT_MS, GIL_WAIT_RATIO, HTTP_ROUTE, INCONSISTENT,
                              REGISTERED, SHARED_THREAD, THREAD_ID, THREAD_NAME, TOP_BLOCKER, TOP_BLOCKER_HOLD_MS,
                              TOP_BLOCKER_THREAD, UNTRACKED, EVERY_ONLY, WHEN_NONZERO)

log = logging.getLogger("otel_gil")

try:
    from otel_gil import _fastspan
except ImportError:  # built without a C compiler: the Python hooks alone
    _fastspan = None
if _fastspan is not None and (_fastspan.LAYOUT_VERSION, _fastspan.SLOT_SIZE) != (ringlib.LAYOUT_VERSION, ringlib.SLOT_SIZE):
    log.warning("otel-gil: the C span hooks were built for another ring layout; using the Python ones "
                "(rebuild them: pip install -e . or reinstall otel-gil)")
    _fastspan = None

_SNAPSHOT_ATTR = "_otel_gil_start"
_THREAD_KEYS = (THREAD_NAME, THREAD_ID)  # set on every span, copied onto its wait spans
CLOCK_SLACK_NS = 50_000  # wait + hold may pass the duration by the clocks' reads around a span
_local = threading.local()
_on_span: list = []  # (name, C method) that wrap_span put on Span, for unwrap_span to take out
_every_attribute = False  # OTEL_GIL_ALL_ATTRIBUTES: GilSpanProcessor sets it, the C hooks get their own copy


class Own(NamedTuple):
    """What a span's own code did on the GIL, where the C hooks track contexts
    (``context_switches.c``; ``Start.own``, a ``_fastspan.Own`` with these fields in this
    order): charged at every switch of context on each thread it ran on, a child span's
    charges included.

    On its home thread (where it started): the GIL it held and took. On other threads
    (workers running its context): its waits, holds, acquisitions and convoy waits, and on
    how many threads (-1: more than 8). ``switched``: its home thread switched contexts while
    it ran (it is shared: an event loop, a greenlet hub). ``unseen``: a switch no hook saw
    changed whose code ran on a thread it ran on; ``broken``: a thread's counters went back
    between two charges; ``untracked``: otel-gil was uninstrumented for a while since it
    started. Each makes its own figures unknown (where other contexts' code, or its own
    elsewhere, were in play).
    """

    hold_home: int
    acquisitions_home: int
    wait_else: int
    hold_else: int
    acquisitions_else: int
    convoy_else: int
    threads_else: int
    switched: bool
    unseen: bool
    broken: bool
    untracked: bool


class _Start:
    """What a span needs at its end: where it started and the counters then (the Python hooks';
    ``shared``: the thread is shared by contexts these hooks cannot tell apart)."""

    __slots__ = ("registration", "ring", "generation", "tid", "mono_ns", "wall_ns", "counters", "status", "metrics",
                 "shared", "parked")
    own = None  # contexts are tracked by the C hooks only

    def __init__(self, registration, ring, generation, tid, mono_ns, wall_ns, counters, status, metrics=None,
                 shared=False) -> None:
        self.registration = registration
        self.ring = ring
        self.generation = generation
        self.tid = tid
        self.mono_ns = mono_ns
        self.wall_ns = wall_ns
        self.counters = counters
        self.status = status
        self.metrics = metrics
        self.shared = shared
        self.parked = None  # parks.snapshot(), while a free-threaded build runs without its GIL


def shared_thread() -> bool:
    """This thread runs many contexts' code in turn, which the Python hooks cannot tell apart:
    an asyncio loop runs here, or this is a greenlet other than the thread's main one."""
    events = sys.modules.get("asyncio.events")
    if events is not None and events._get_running_loop() is not None:
        return True
    greenlet = sys.modules.get("greenlet")
    return greenlet is not None and getattr(greenlet.getcurrent(), "parent", None) is not None


def _thread_tid(generation: int) -> list:
    """[generation, tid, slot index hint] cached per thread; reset when the ring or pid changes."""
    cache = getattr(_local, "cache", None)
    if cache is None or cache[0] != generation:
        cache = _local.cache = [generation, threading.get_native_id(), -1]
    return cache


def _read(ring: ringlib.Ring, cache: list, until: Optional[int] = None) -> tuple[int, ringlib.Counters]:
    """The calling thread's counters and the monotonic time they are at (``Ring.read``)."""
    if cache[2] >= 0:
        read = ring.read(cache[2], cache[1], until)
        if read is not None:
            return read
    index = ring.find(cache[1])
    if index >= 0:
        cache[2] = index
        read = ring.read(index, cache[1], until)
        if read is not None:
            return read
    now = time.monotonic_ns()  # no GIL hand-off on this thread since registration
    return (now if until is None else min(now, until)), ringlib.ZERO


def snapshot(registration: Backend, metrics: Optional[GilMetrics] = None, span: Optional[Span] = None) -> _Start:
    registration.check_fork()  # a fork by C code (uWSGI) runs no Python at-fork hook; a child registers now
    state = registration.state  # one read: a ring with its own status and generation
    cache = _thread_tid(state.generation)
    if state.ring is None or state.status != REGISTERED:
        now, wall = time.monotonic_ns(), time.time_ns()
        start = _Start(registration, None, state.generation, cache[1], now, wall, ringlib.ZERO, state.status, metrics)
        if parks.current is not None:  # on a shared thread, by context where the C charge points run
            start.parked = parks.snapshot(span) if parks.contexts else None if shared_thread() else parks.snapshot()
        return start
    now, counters = _read(state.ring, cache)
    return _Start(registration, state.ring, state.generation, cache[1], now, time.time_ns(), counters, state.status,
                  metrics, shared_thread())


def _last_wait_end(ring: ringlib.Ring, index: int, counters: ringlib.Counters) -> int:
    """When the thread's latest long wait ended (0 if it had none)."""
    if not counters.long_waits:
        return 0
    return ring.slot(index).ring[(counters.long_waits - 1) % ringlib.RING_LEN].end_ns


def blocker_spans(wall_minus_mono: int) -> Optional[Callable[[int, int, int], Optional[tuple[str, str]]]]:
    """``span_of(tid, start_ns, end_ns)``: (name, span id) of the span whose code thread ``tid``
    ran within that stretch (monotonic ns): on a thread whose contexts switch (an event loop,
    a greenlet hub), the one that ran longest there, from the thread's switch log; on any other,
    the span it is in now if that began by ``start_ns``. None where the threads' OpenTelemetry
    contexts cannot be read (no C extension, another runtime context). Rare path: spans with
    long waits only."""
    var = getattr(getattr(otel_context, "_RUNTIME_CONTEXT", None), "_current_context", None)
    if _fastspan is None or not isinstance(var, contextvars.ContextVar):
        return None
    native = {t.ident: t.native_id for t in threading.enumerate()}
    spans = {}
    for ident, ctx in _fastspan.thread_contexts().items():
        current = ctx.get(var)
        if current is not None and ident in native:
            span = trace.get_current_span(current)
            if span.is_recording():
                spans[native[ident]] = span

    def span_of(tid: int, start_ns: int, end_ns: int) -> Optional[tuple[str, str]]:
        switching = _fastspan.held_by(tid, start_ns, end_ns)
        if switching is not None:
            return switching or None
        span = spans.get(tid)
        start = getattr(span, "start_time", None)
        if start is None or start > start_ns + wall_minus_mono:
            return None
        return span.name, format_span_id(span.get_span_context().span_id)

    return span_of


def figures(
    start: _Start, span_start_ns: int, end_time: Optional[int] = None
) -> tuple[dict, list[tuple[str, dict, int, int]], int]:
    """Attributes, ``(name, attributes, start, end)`` events (wall clock ns: the event's
    timestamp is its start) and the end time (wall clock ns) of a span ending now, or at
    ``end_time`` if one is given.

    ``span_start_ns`` is the span's own (wall clock) start. The counters are read at
    the end, on the monotonic clock, where open intervals are closed (at an explicit
    end, mapped onto that clock, if it is earlier). A span
    may carry a start time from before it was created (Flask's server span starts
    when the WSGI call does): long waits of that stretch are still in the ring, so
    they are counted too; shorter waits and holds there are not visible.
    """
    thread = threading.current_thread()
    attrs: dict = {THREAD_NAME: thread.name, THREAD_ID: thread.ident}
    ring = start.ring
    if ring is None:
        parked, events = parks.figures(start.parked, start.wall_ns - start.mono_ns)
        attrs.update(parked)
        turned_on = getattr(start.registration, "turned_on", None) if start.status == GIL_DISABLED else None
        if turned_on is not None:  # an import turned a free-threaded build's GIL on as it ran
            attrs[GIL_STATUS] = GIL_TURNED_ON
            return attrs, [free_threading.event(turned_on), *events], end_time or time.time_ns()
        attrs[GIL_STATUS] = start.status
        return attrs, events, end_time or time.time_ns()
    cache = _thread_tid(start.generation)
    if cache[1] != start.tid:
        attrs[GIL_STATUS] = CROSS_THREAD
        return attrs, [], end_time or time.time_ns()
    current = start.registration.state
    if current.ring is not ring:
        attrs[GIL_STATUS] = current.status if current.status != REGISTERED else COLLECTOR_CHANGED
        return attrs, [], end_time or time.time_ns()
    until = None if end_time is None else start.mono_ns + max(end_time - start.wall_ns, 0)
    own = None if start.own is None else Own(*start.own)
    if until is not None and own is not None and (own.switched or own.threads_else) and until + CLOCK_SLACK_NS < time.monotonic_ns():
        attrs[GIL_STATUS] = END_PASSED  # its code was charged up to now, past its end
        return attrs, [], end_time
    try:
        now, end = _read(ring, cache, until)
    except ringlib.EndPassed:  # ended at an explicit time, and the GIL changed hands since: unknown then
        attrs[GIL_STATUS] = END_PASSED
        return attrs, [], end_time
    except ringlib.BusySlot:
        return _dropped(start, attrs), [], end_time or time.time_ns()
    span_end_ns = end_time or time.time_ns()  # after the read: the figures are at or before the span's end
    wait1, hold1, acquisitions1, convoy1, long_waits1 = end
    wait0, hold0, acquisitions0, convoy0, long_waits0 = start.counters
    wait, hold, acquisitions, convoy = wait1 - wait0, hold1 - hold0, acquisitions1 - acquisitions0, convoy1 - convoy0
    events = []
    # A long wait wholly before the span object existed fits only in a gap at least that long.
    gap = start.wall_ns - span_start_ns
    gap = gap if gap >= ring.long_wait_ns else 0
    if cache[2] >= 0 and (long_waits1 > long_waits0 or gap and _last_wait_end(ring, cache[2], end) > start.mono_ns - gap):
        since = long_waits0 if not gap else max(long_waits0 - ringlib.RING_LEN, 0)
        waits, _ = ringlib.long_waits_since(ring.slot(cache[2]), since)
        dropped = long_waits1 - long_waits0 - ringlib.RING_LEN
        if dropped > 0:
            attrs[GIL_LONG_WAITS_DROPPED] = dropped
        waits = [w for w in waits if w.start_ns >= start.mono_ns - gap and w.end_ns <= now]
        wall_minus_mono = start.wall_ns - start.mono_ns
        log = blamelib.HoldLog.read(ring, waits[0].start_ns) if waits else None
        span_of = blocker_spans(wall_minus_mono) if waits else None
        blames = []
        for w in waits:
            length = w.end_ns - w.start_ns
            if w.end_ns <= start.mono_ns:  # before the span object existed: not in the counters
                wait += length
                acquisitions += 1
                convoy += length >= ring.header.convoy_ns
            blames.append(log.blame(w))
            events.append((GIL_WAIT, blamelib.event_attributes(blames[-1], threads.owner, span_of),
                           w.start_ns + wall_minus_mono, w.end_ns + wall_minus_mono))
        top = blamelib.top_blocker(blames)
        if top is not None:
            attrs.update(blamelib.thread_attributes(TOP_BLOCKER_THREAD, top[0], threads.owner, *top[2:]))
            attrs[TOP_BLOCKER_HOLD_MS] = round(top[1] / 1e6, 3)
            attrs.update(blamelib.code_attributes(TOP_BLOCKER, blamelib.top_location(blames, top[0])))
        if start.metrics is not None:
            start.metrics.count_unlocated(blamelib.unlocated(blames))
    duration = max(span_end_ns - span_start_ns, now - start.mono_ns, 1)
    shown = own_figures(wait, hold, acquisitions, convoy, own, getattr(start, "shared", False), duration)
    if shown is None:
        return _dropped(start, attrs), [], span_end_ns
    attrs.update(shown)
    return attrs, events, span_end_ns


def own_figures(wait: int, hold: int, acquisitions: int, convoy: int, own: Optional[Own], shared: bool,
                duration: int) -> Optional[dict]:
    """A span's ``gil.*`` figures from its home thread's deltas over its lifetime and, where
    the C hooks track contexts, what its own code did (``_fastspan.c``'s fast_figures is the
    same in C); None where they break an invariant (the span's figures are then dropped).

    - ``gil.hold_ms``: held by the span's own code. On a thread no other context ran on
      while the span did, the thread's hold; on a shared one, the charges of its own code.
      Plus its code's holds on other threads.
    - ``gil.wait_ms``: what held it up: its thread's waits while it was in flight (on an
      event loop, the loop could run none of its tasks), plus its code's waits elsewhere.
    - ``gil.others_hold_ms`` (shared threads): its thread held the GIL for other contexts'
      code (other requests, the loop's own work) while it was in flight.

    Invariants, per thread: on the home thread wait + held (own and others') <= duration,
    own <= held; on other threads, their waits and holds <= duration x those threads.
    So wait + hold <= duration x (1 + threads elsewhere), and so do the ratios.
    """
    if min(wait, hold, acquisitions, convoy) < 0 or wait + hold > duration + CLOCK_SLACK_NS:
        return None
    if own is not None and own.broken:
        return None
    if own is not None and own.untracked and (own.switched or own.threads_else):
        return {GIL_STATUS: UNTRACKED}
    if shared or (own is not None and own.unseen):
        # Other contexts' code ran here unseen: no hold is this span's for sure. The waits are the thread's.
        return {GIL_STATUS: SHARED_THREAD, GIL_WAIT_MS: wait / 1e6, GIL_WAIT_RATIO: wait / duration,
                GIL_CONVOY_WAITS: convoy}
    shown = {}
    if own is not None:
        if own.switched:
            if own.hold_home > hold:
                return None
            shown[GIL_OTHERS_HOLD_MS] = (hold - own.hold_home) / 1e6
            hold, acquisitions = own.hold_home, own.acquisitions_home
        if own.threads_else >= 0 and own.wait_else + own.hold_else > duration * own.threads_else + CLOCK_SLACK_NS:
            return None
        wait += own.wait_else
        hold += own.hold_else
        acquisitions += own.acquisitions_else
        convoy += own.convoy_else
    shown.update(
        {
            GIL_WAIT_MS: wait / 1e6,  # not rounded: round() costs more than the rest of the figures
            GIL_HOLD_MS: hold / 1e6,
            GIL_WAIT_RATIO: wait / duration,
            GIL_HOLD_RATIO: hold / duration,
            GIL_ACQUISITIONS: acquisitions,
            GIL_CONVOY_WAITS: convoy,
        }
    )
    return shown


def _dropped(start: _Start, attrs: dict) -> dict:
    """A span's attributes when its figures broke an invariant or could not be read whole: counted, never exported."""
    if start.metrics is not None:
        start.metrics.count_dropped(INCONSISTENT)
    return {k: attrs[k] for k in _THREAD_KEYS} | {GIL_STATUS: INCONSISTENT}


class GilSpanProcessor(SpanProcessor):
    """Snapshots the thread's GIL counters as each span starts (figures land at ``Span.end``).

    :func:`hook_provider` puts it on a provider. ``fast``: the C hooks, where they were built;
    they take ``Span.start``'s place instead of being called as a span processor.
    ``every_attribute``: every figure on every span (``carried``).
    """

    def __init__(self, registration: Backend, metrics: Optional[GilMetrics] = None, fast: bool = True,
                 every_attribute: bool = False) -> None:
        global _every_attribute
        _every_attribute = every_attribute
        self.registration = registration
        self.metrics = metrics
        self._hooks = None
        self._scope = None  # the provider's span processor, where Span.start snapshots in C
        if fast and _fastspan is not None:
            self._hooks = _fastspan.Hooks(
                registration, metrics, REGISTERED, self._snapshot_onto, end_wrapper, record_server_span, SpanKind.SERVER,
                every_attribute
            )
        self._enabled = True

    @property
    def enabled(self) -> bool:
        return self._enabled

    @enabled.setter
    def enabled(self, value: bool) -> None:
        self._enabled = value
        if self._hooks is not None:
            self._hooks.enabled = value

    def on_start(self, span: Span, parent_context=None) -> None:
        if self._enabled:
            self._snapshot_onto(span)

    def _snapshot_onto(self, span: Span) -> None:
        try:
            setattr(span, _SNAPSHOT_ATTR, snapshot(self.registration, self.metrics, span))
        except Exception:  # never let a span hook break the app
            _log_once("otel-gil: reading the GIL ring failed at span start")

    def on_end(self, span: ReadableSpan) -> None:
        pass

    def shutdown(self) -> None:
        self.enabled = False

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def hook_provider(provider: TracerProvider, processor: GilSpanProcessor) -> None:
    """Give the spans of ``provider`` the processor's figures, from now on.

    With the C hooks, ``Span.start`` and ``Span.end`` are replaced by C methods that act on
    this provider's spans only (``span._span_processor`` is its processor): the SDK calls no
    processor of ours, which would cost more than the snapshot. Otherwise the processor is
    added to the provider and ``Span.end`` wrapped by :func:`end_wrapper`.
    """
    scope = getattr(provider, "_active_span_processor", None)
    if processor._hooks is not None and scope is not None and callable(Span.__dict__.get("start")):
        processor._scope = scope
    else:
        provider.add_span_processor(processor)
    wrap_span(processor)


def wrap_span(processor: GilSpanProcessor) -> None:
    """Put the processor's hooks on ``Span`` (again, after :func:`unwrap_span`)."""
    if processor._scope is not None:
        Span.start = processor._hooks.start_method(Span.__dict__["start"], processor._scope)
        _on_span.append(("start", Span.__dict__["start"]))
    if processor._hooks is not None:
        Span.end = processor._hooks.end_method(Span.__dict__["end"])
        _on_span.append(("end", Span.__dict__["end"]))
        _track_contexts(processor._hooks)
    else:
        wrappers.wrap(Span, "end", end_wrapper)


def unwrap_span() -> None:
    """Undo :func:`wrap_span`: ours out of ``Span``'s methods, other libraries' wrappers kept
    (one put on after ours and not re-pointable keeps it: the C methods of a disabled processor
    pass through)."""
    if _fastspan is not None:
        _fastspan.untrack_contexts()
    while _on_span:
        wrappers.remove(Span, *_on_span.pop())
    wrappers.unwrap(Span, "end", end_wrapper)


def _track_contexts(hooks) -> None:
    """The C hooks charge each span its own code's GIL time at every switch of context
    (``context_switches.c``). Where they cannot (OpenTelemetry keeps its context elsewhere
    than a ContextVar, or this interpreter's context watchers are all taken), every span goes
    through the Python hooks, which say ``gil.status=shared_thread`` on shared threads."""
    var = getattr(getattr(otel_context, "_RUNTIME_CONTEXT", None), "_current_context", None)
    key = getattr(trace_propagation, "_SPAN_KEY", None)
    if not isinstance(var, contextvars.ContextVar) or not isinstance(key, str):
        log.warning("otel-gil: OpenTelemetry's current context is not kept in a ContextVar here: figures on "
                    "event loops and greenlets say gil.status=shared_thread")
        return
    try:
        _fastspan.track_contexts(hooks, var, key)
    except Exception as exc:
        log.warning("otel-gil: context switches cannot be followed (%s): figures on event loops and greenlets "
                    "say gil.status=shared_thread", exc)
        return
    _watch_loop_imports()


def _watch_loop_imports() -> None:
    """A loop module (uvloop) imported after ``instrument()`` has its GOT hooked as its import
    ends (app start, loop creation), not by the first span on its loop: a request's path."""
    global _watching_loops
    if not _watching_loops:
        _watching_loops = True
        for name in _fastspan.module_switches():  # (none from 3.14: the context watcher sees all)
            wrapt.register_post_import_hook(lambda module: _fastspan.hook_loop_modules(), name)


_watching_loops = False  # wrapt's post-import hooks stay for the process's life (no-ops while untracked)


def end_wrapper(wrapped, instance: Span, args, kwargs):
    """``wrapt`` wrapper of ``Span.end``: figures go on while the span is still writable.

    The end time is fixed here (as the SDK would) so that ratios use the span's own duration.
    """
    start = getattr(instance, _SNAPSHOT_ATTR, None)
    if start is None or instance.end_time is not None or instance.start_time is None:
        return wrapped(*args, **kwargs)
    end_time = args[0] if args else kwargs.get("end_time")
    try:
        attrs, events, end_time = figures(start, instance.start_time, end_time)
        _set_attributes(instance, carried(attrs))
        for name, attributes, timestamp, _ in events:
            instance.add_event(name, attributes, timestamp)
        wait_spans.draw(instance, start, events, {k: attrs[k] for k in _THREAD_KEYS}, start_of=_started,
                        shared=attrs.get(GIL_STATUS) in (SHARED_THREAD, UNTRACKED),
                        held_by=_fastspan.held_by if _fastspan is not None and start.own is not None else None)
        if start.metrics is not None and instance.kind is SpanKind.SERVER and GIL_WAIT_RATIO in attrs:
            record_server_span(start, instance, attrs[GIL_WAIT_RATIO])
    except Exception:
        _log_once("otel-gil: computing the GIL figures of a span failed")
    return wrapped(end_time=end_time)


def _started(span: Span):
    """The snapshot taken as ``span`` started, None if otel-gil took none."""
    return getattr(span, _SNAPSHOT_ATTR, None)


def record_server_span(start: _Start, span: Span, wait_ratio: float) -> None:
    """Feed a server span's wait ratio to the ``gil.wait_ratio`` histogram, by route."""
    try:
        route = span.attributes.get(HTTP_ROUTE) or span.name
        start.metrics.record_span(wait_ratio, str(route))
    except Exception:
        _log_once("otel-gil: recording the GIL wait ratio of a server span failed")


def carried(attrs: dict) -> dict:
    """The attributes a span carries of those computed (``semconv.ALWAYS``, ``WHEN_NONZERO``,
    ``EVERY_ONLY``): all of them with ``OTEL_GIL_ALL_ATTRIBUTES``."""
    if _every_attribute:
        return attrs
    return {k: v for k, v in attrs.items() if not (k in EVERY_ONLY or (k in WHEN_NONZERO and not v))}


def _set_attributes(span: Span, attrs: dict) -> None:
    """``span.set_attributes(attrs)`` in one pass, without the SDK's per-value cleaning where that is safe.

    Our values are already clean (numbers, a thread name): with room under the
    span's attribute limits, they go straight into its attribute dict, under the
    span's and the dict's locks taken once, as ``set_attributes`` would leave them
    (a key already there moves to the end). Cleaning each value costs more than
    everything else otel-gil does per span. Anything unexpected (another SDK's
    internals, limits that would apply) takes the public path.
    """
    bounded = getattr(span, "_attributes", None)
    target, lock = getattr(bounded, "_dict", None), getattr(bounded, "_lock", None)
    if (
        isinstance(target, dict) and lock is not None and getattr(bounded, "_immutable", True) is False
        and getattr(bounded, "max_value_len", 0) is None
        and (bounded.maxlen is None or len(target) + len(attrs) <= bounded.maxlen)
    ):
        with span._lock, lock:
            if span.end_time is None:
                for key in attrs:
                    target.pop(key, None)
                target.update(attrs)
                return
    span.set_attributes(attrs)


_logged: set[str] = set()


def _log_once(message: str) -> None:
    if message not in _logged:
        _logged.add(message)
        log.exception(message)

"""``gil.wait`` child spans: each long wait drawn as a span of its own, once per trace, so
that a trace's timeline shows the bars where the request stood still for the GIL.

Every span in flight on the waiting thread carries a wait (in its figures and as a ``gil.wait``
event; on an event loop, every request in flight), but a trace draws it once: under the span
whose code it held up, or under the nearest common ancestor of the spans it held up. Each span
decides as it ends, for its waits and those its children handed up to it:

- a wait another span of its trace drew is not drawn again (``_drawn``: the last ``MAX_DRAWN``
  waits drawn, by trace, thread and the ring's start and end, which identify a wait);
- where its parent carries the wait too (open, started on the same thread before the wait), it
  hands the wait up, unless the code running when the wait began was its own: on a thread whose
  contexts switch (an event loop, a greenlet hub), the span running there then, from the
  thread's switch log (none: the loop's own code, or no log that far back); the parent draws what
  it was handed by the same rule, even a wait gone from its slot's ring by then;
- else it draws it under itself. On a thread that runs one context, the innermost span carrying a
  wait is the one whose code it held up: the first of them to end draws it.

A wait span has the wait's own start and end, the waiting thread's ``thread.id``/``thread.name``
(as on any span) and the attributes of its ``gil.wait`` event (who held the GIL, and where). It
is made through the span processor of the span it is drawn under (the provider's exporters see it
like any span), under otel_gil's instrumentation scope, and bypasses otel-gil's span hooks: it
gets no GIL figures and no wait spans of its own. A span carries at most the 16 long waits a
thread's slot keeps (``RING_LEN``; its ``gil.long_waits_dropped`` counts the rest), and keeps the
last ``MAX_HANDED`` its children handed up (a streaming response's span may live for hours; its
``gil.wait_spans_dropped`` counts the rest, each still an event of the child that handed it up).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from types import MappingProxyType
from typing import Callable, NamedTuple, Optional

from opentelemetry import trace
from opentelemetry.sdk.trace import Span, _Span  # _Span: what the SDK's tracers instantiate (Span refuses)
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind

from otel_gil.ring import RING_LEN
from otel_gil.semconv import GIL_WAIT, GIL_WAIT_SPANS_DROPPED
from otel_gil.version import __version__

MAX_HANDED = RING_LEN  # waits handed up that an open span keeps, the last ones
MAX_DRAWN = 4096  # waits drawn that later spans of their traces are told about (a duplicate bar past that)
_SCOPE = InstrumentationScope("otel_gil", __version__)
_HANDED = "_otel_gil_handed_waits"  # on an open span: {wait key: Wait} its children handed up to it
_CLOSED = MappingProxyType({})  # ... once it drew its waits: no more hand-ups (a child ending now draws its own)
_DROPPED = "_otel_gil_handed_dropped"  # on an open span: how many hand-ups it let go past MAX_HANDED
_ids = RandomIdGenerator()
_drawn: OrderedDict = OrderedDict()  # (trace id, thread, start, end) of the waits drawn, oldest first
_lock = threading.Lock()  # _drawn and the hand-ups, between spans ending on several threads
threshold_ns = 0  # waits at least this long get a span; 0: none (the instrumentor configures it)


def _after_fork() -> None:
    """A child forked while another thread drew waits: that thread is not in the child to release the lock."""
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def configure(threshold_ms: float) -> None:
    """Waits at least ``threshold_ms`` long get a span; 0 (or less) turns them off."""
    global threshold_ns
    threshold_ns = max(int(threshold_ms * 1e6), 0)


class Wait(NamedTuple):
    """A wait to draw: its thread's kernel id, its start and end as its slot's ring has them
    (monotonic ns), the same on the wall clock, its span's attributes and name (its event's:
    ``gil.wait``, or ``cpython.park`` for a free-threaded build's park)."""

    tid: int
    start_ns: int
    end_ns: int
    wall_start_ns: int
    wall_end_ns: int
    attributes: dict
    name: str = GIL_WAIT


def draw(span: Span, start, events: list[tuple[str, dict, int, int]], thread: dict, *, shared: bool,
         held_by: Optional[Callable], start_of: Callable[[Span], object]) -> None:
    """Draw, or hand up to the parent, the waits of ``span`` at least ``threshold_ns`` long and
    those its children handed up to it; called while ``span`` is still open.

    ``start``: its snapshot (``tid``, ``mono_ns``, ``wall_ns``); ``events``: its ``gil.wait``
    events (``spans.figures``: wall clock start and end); ``thread``: the waiting thread's
    ``thread.*``; ``shared``: other contexts' code ran on its thread unseen (whose code a wait
    held up is unknown); ``held_by``: ``_fastspan.held_by``, where the switch hooks tracked this
    span, else None; ``start_of(span)``: a span's snapshot, None if it has none.
    """
    if not threshold_ns:
        return
    offset = start.wall_ns - start.mono_ns  # as figures() mapped the ring's times onto the wall clock
    waits = {}  # by what identifies a wait: its thread and its ring times
    for name, attributes, wall_start, wall_end in events:
        if wall_end - wall_start >= threshold_ns:
            wait = Wait(start.tid, wall_start - offset, wall_end - offset, wall_start, wall_end,
                        {**thread, **attributes}, name)
            waits[wait[:3]] = wait
    with _lock:
        handed = getattr(span, _HANDED, None)
        setattr(span, _HANDED, _CLOSED)
        dropped = getattr(span, _DROPPED, 0)
    if dropped:
        span.set_attribute(GIL_WAIT_SPANS_DROPPED, dropped)
    if handed:
        waits.update(handed)
    if not waits:
        return
    context = span.get_span_context()
    parent = _open_parent(span, start, start_of)
    running = _running(shared, held_by)
    mine = []
    with _lock:
        for key, wait in waits.items():
            drawn = (context.trace_id, *key)
            if drawn in _drawn:
                continue
            if parent is not None and parent[1] <= wait.start_ns and running(wait) not in (None, context.span_id):
                up = getattr(parent[0], _HANDED, None)
                if up is None:
                    setattr(parent[0], _HANDED, {key: wait})
                    continue
                if up is not _CLOSED:
                    _hand_up(parent[0], up, key, wait)
                    continue
            mine.append(wait)
            _drawn[drawn] = None
            while len(_drawn) > MAX_DRAWN:
                _drawn.popitem(last=False)
    _emit(span, mine)


def _hand_up(parent: Span, up: dict, key: tuple, wait: Wait) -> None:
    """Add ``wait`` to what ``parent`` was handed; past ``MAX_HANDED``, its oldest is let go, counted."""
    if key not in up and len(up) >= MAX_HANDED:
        del up[next(iter(up))]
        setattr(parent, _DROPPED, getattr(parent, _DROPPED, 0) + 1)
    up[key] = wait


def _open_parent(span: Span, start, start_of) -> Optional[tuple[Span, int]]:
    """``span``'s parent and its start (monotonic ns), where it may carry the span's waits: a
    local span still open, current as ``span`` ends (as it is where ``span`` was current until
    then), whose snapshot was taken on the same thread. None otherwise: ``span`` draws its waits."""
    parent, current = span.parent, trace.get_current_span()
    if (parent is None or parent.is_remote or not isinstance(current, Span) or current.end_time is not None
            or current.get_span_context().span_id != parent.span_id or current.start_time is None):
        return None
    snapshot = start_of(current)
    if snapshot is None or snapshot.tid != start.tid:
        return None
    return current, snapshot.mono_ns - max(snapshot.wall_ns - current.start_time, 0)


def _running(shared: bool, held_by: Optional[Callable]) -> Callable[[Wait], Optional[int]]:
    """``running(wait)``: the id of the span whose code ran on the wait's thread as it began; 0:
    none (the loop's own code) or unknown; None: the thread runs one context at a time (the
    innermost span open there, so the first to end of those carrying the wait)."""
    if shared:
        return lambda wait: 0
    if held_by is None:
        return lambda wait: None

    def running(wait: Wait) -> Optional[int]:
        held = held_by(wait.tid, wait.start_ns, wait.start_ns + 1)
        return None if held is None else int(held[1], 16) if held else 0

    return running


def _original(name: str):
    """``Span.<name>`` as the SDK has it, under any otel-gil hook (C or wrapt) put on it."""
    method = Span.__dict__[name]
    return getattr(method, "__wrapped__", method)


def _emit(parent: Span, waits: list[Wait]) -> None:
    """End a child span of ``parent`` for each wait (called while ``parent`` is still open)."""
    if not waits:
        return
    parent_context = parent.get_span_context()
    start, end = _original("start"), _original("end")
    for wait in waits:
        context = SpanContext(parent_context.trace_id, _ids.generate_span_id(), is_remote=False,
                              trace_flags=parent_context.trace_flags, trace_state=parent_context.trace_state)
        child = _Span(wait.name, context, parent=parent_context, resource=parent.resource, attributes=wait.attributes,
                      kind=SpanKind.INTERNAL, span_processor=parent._span_processor, instrumentation_scope=_SCOPE,
                      limits=parent._limits)
        start(child, start_time=wait.wall_start_ns)
        end(child, end_time=wait.wall_end_ns)

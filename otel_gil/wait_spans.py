"""``gil.wait`` child spans: each long wait inside a span drawn as a span of its own, so
that a trace's timeline shows the bars where the request stood still for the GIL.

Made when the parent ends (its waits are then known from the ring), with the wait's own
start and end, the waiting thread's ``thread.id``/``thread.name`` (as on any span), the
attributes of its ``gil.wait`` event (who held the GIL, and where), through the parent's
span processor (the provider's exporters see them like any span) and under otel_gil's
instrumentation scope. They bypass otel-gil's span hooks: a wait
span gets no GIL figures and no wait spans of its own. They are as many as the span's
``gil.wait`` events at most: the 16 long waits a thread's slot keeps (``RING_LEN``; the
parent's ``gil.long_waits_dropped`` counts the rest).
"""

from __future__ import annotations

from opentelemetry.sdk.trace import Span, _Span  # _Span: what the SDK's tracers instantiate (Span refuses)
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind

from otel_gil.semconv import GIL_WAIT
from otel_gil.version import __version__

_SCOPE = InstrumentationScope("otel_gil", __version__)
_ids = RandomIdGenerator()
threshold_ns = 0  # waits at least this long get a span; 0: none (the instrumentor configures it)


def configure(threshold_ms: float) -> None:
    """Waits at least ``threshold_ms`` long get a span; 0 (or less) turns them off."""
    global threshold_ns
    threshold_ns = max(int(threshold_ms * 1e6), 0)


def pick(events: list[tuple[str, dict, int, int]]) -> list[tuple[str, dict, int, int]]:
    """The waits (``figures``' events) that get a span."""
    return [e for e in events if e[3] - e[2] >= threshold_ns] if threshold_ns else []


def _original(name: str):
    """``Span.<name>`` as the SDK has it, under any otel-gil hook (C or wrapt) put on it."""
    method = Span.__dict__[name]
    return getattr(method, "__wrapped__", method)


def emit(parent: Span, waits: list[tuple[str, dict, int, int]], thread: dict) -> None:
    """End a child span of ``parent`` for each wait (called while ``parent`` is still open);
    ``thread`` holds the waiting thread's ``thread.*`` attributes."""
    if not waits:
        return
    parent_context = parent.get_span_context()
    start, end = _original("start"), _original("end")
    for _, attributes, start_ns, end_ns in waits:
        context = SpanContext(parent_context.trace_id, _ids.generate_span_id(), is_remote=False,
                              trace_flags=parent_context.trace_flags, trace_state=parent_context.trace_state)
        child = _Span(GIL_WAIT, context, parent=parent_context, resource=parent.resource, attributes={**thread, **attributes},
                     kind=SpanKind.INTERNAL, span_processor=parent._span_processor, instrumentation_scope=_SCOPE,
                     limits=parent._limits)
        start(child, start_time=start_ns)
        end(child, end_time=end_ns)

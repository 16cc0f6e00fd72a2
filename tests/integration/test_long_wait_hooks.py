"""The C span hooks' long wait (otel_gil/long_waits.c) against the Python hooks': in one
process, one real long wait (a thread named "blocker" holds the GIL 4 ms through a
ctypes.PyDLL call), its blame computed by ``spans.figures`` from the span's own snapshot,
then the span ended by the C hooks, which must leave the same ``gil.wait`` event and
``gil.top_blocker.*`` attributes, and take most such spans themselves."""

from __future__ import annotations

import copy
import ctypes
import threading
import time

import pytest
from opentelemetry.sdk.trace import SpanLimits, TracerProvider

from otel_gil import spans, threads, wait_spans
from otel_gil.inprocess import InProcess
from otel_gil.semconv import TOP_BLOCKER

if spans._fastspan is None:
    pytest.fail("otel_gil._fastspan is not built: pip install -e .")


@pytest.fixture
def span_limits(request):
    """The provider's limits (indirect parametrization), the SDK's defaults unless given."""
    return getattr(request, "param", None)


@pytest.fixture(params=[0, 50], ids=["no wait spans", "wait spans from 50 ms"])
def setup(monkeypatch, request, span_limits):
    monkeypatch.setattr(wait_spans, "threshold_ns", request.param * 1_000_000)
    registration = InProcess(long_wait_ns=1_000_000)
    registration.start()
    handed, python_end = [], spans.end_wrapper

    def end_wrapper(*args):
        handed.append(args[1])
        return python_end(*args)

    monkeypatch.setattr(spans, "end_wrapper", end_wrapper)
    provider = TracerProvider(span_limits=span_limits)
    hook = spans.GilSpanProcessor(registration, None, fast=True)
    spans.hook_provider(provider, hook)
    threads.watch_starts()
    usleep = ctypes.PyDLL(None).usleep
    go, entered = threading.Lock(), threading.Lock()
    go.acquire()
    entered.acquire()

    def hold():
        while go.acquire() and not stop:
            entered.release()
            usleep(4000)

    stop = False
    blocker = threading.Thread(target=hold, name="blocker", daemon=True)
    blocker.start()
    yield provider.get_tracer("t"), go, entered, handed, blocker
    stop = True
    go.release()
    blocker.join()
    spans.unwrap_span()
    threads.unwatch_starts()
    registration.stop()


def _plain(value):
    return tuple(value) if isinstance(value, list) else value


def _long_wait(tracer, go, entered, handed, named: str) -> bool:
    """One span with a long wait, ended by the C hooks, whose figures must be the Python hooks'
    (``spans.figures`` on the same wait), its blocker named ``named``: whether it had the wait
    and the C hooks took it."""
    span = tracer.start_span("op")
    go.release()
    entered.acquire()  # the blocker took the GIL: this thread waits 4 ms for it
    start = getattr(span, spans._SNAPSHOT_ATTR)
    attrs, events, _ = spans.figures(start, span.start_time)
    span.end()
    if not events:  # the OS ran this thread after the blocker's hold now and then: no wait
        return False
    expected = {k: v for k, v in attrs.items() if k.startswith(TOP_BLOCKER)}
    assert expected[f"{TOP_BLOCKER}.thread.name"] == named
    assert {k: v for k, v in span.attributes.items() if k.startswith(TOP_BLOCKER)} == expected
    assert list(span.attributes)[2:2 + len(expected)] == list(expected)  # after thread.*, before gil.wait_ms
    (name, event_attrs, timestamp, _), = events
    (event,) = span.events
    assert (event.name, event.timestamp) == (name, timestamp)
    assert dict(event.attributes) == {k: _plain(v) for k, v in event_attrs.items()}
    assert list(event.attributes) == list(event_attrs)
    assert dict(copy.deepcopy(event.attributes)) == dict(event.attributes)  # (its lock, shared: taken to copy)
    with pytest.raises(TypeError):
        event.attributes["x"] = 1  # immutable, as the SDK's add_event leaves it
    if wait_spans.threshold_ns:  # a wait shorter than that drawn by none: hand-ups to this span closed
        assert getattr(span, wait_spans._HANDED) is wait_spans._CLOSED
    return span not in handed  # (a thread freed meanwhile: its owners settled by Python's first)


def test_a_long_wait_gets_the_python_hooks_figures_from_c(setup):
    tracer, go, entered, handed, _ = setup
    compared = sum(_long_wait(tracer, go, entered, handed, "blocker") for _ in range(20))
    assert compared >= 10, f"only {compared} of 20 spans had a long wait taken by the C hooks"


def test_the_blocker_is_named_anew_after_a_rename(setup):
    tracer, go, entered, handed, blocker = setup
    compared = 0
    for i in range(20):
        blocker.name = f"blocker {i}"
        compared += _long_wait(tracer, go, entered, handed, f"blocker {i}")
    assert compared >= 10, f"only {compared} of 20 spans had a long wait taken by the C hooks"


def test_a_new_owner_of_the_blockers_kernel_id_names_the_waits_after_it(setup):
    """The kernel gives an ended thread's id to a later thread: threads learns of the new owner
    (as at its start), and the C hooks, which keep what they read of the owners, name it."""
    tracer, go, entered, handed, blocker = setup
    compared = [0, 0]
    for i in range(40):
        if i == 20:
            now = time.monotonic_ns()
            threads._memory.add(threads._Owner(blocker.native_id, now, now, 12345, "reborn"))
        compared[i >= 20] += _long_wait(tracer, go, entered, handed, "blocker" if i < 20 else "reborn")
    assert min(compared) >= 10, f"{compared} of 20 spans before and after had a long wait taken by the C hooks"


def _wait_in(tracer, go, entered, handed, before: int = 0):
    """A span with `before` events of its own, then a long wait: the span, the figures' events, whether
    the C hooks took it."""
    span = tracer.start_span("op")
    for i in range(before):
        span.add_event(f"before {i}")
    go.release()
    entered.acquire()  # the blocker took the GIL: this thread waits 4 ms for it
    _, events, _ = spans.figures(getattr(span, spans._SNAPSHOT_ATTR), span.start_time)
    span.end()
    return span, events, span not in handed


@pytest.mark.parametrize("span_limits", [SpanLimits(max_events=1)], indirect=True)
def test_a_span_at_its_event_limit_keeps_the_long_wait_and_counts_the_dropped_as_the_sdk(setup):
    """The SDK's events at their limit drop the oldest and count it (BoundedList.append): the C
    hooks' event goes in the same way."""
    tracer, go, entered, handed, _ = setup
    taken = 0
    for _ in range(20):
        span, events, c_hooks = _wait_in(tracer, go, entered, handed, before=1)
        if events:
            assert [e.name for e in span.events] == [events[0][0]]
            assert span.dropped_events == 1
            taken += c_hooks
    assert taken >= 10, f"only {taken} of 20 spans had a long wait taken by the C hooks"


@pytest.mark.parametrize("span_limits", [SpanLimits(max_event_attributes=3)], indirect=True)
def test_an_event_attribute_limit_leaves_the_event_to_the_sdk(setup):
    """Under a limit of the event's attributes the SDK keeps the last ones and counts the
    dropped: the C hooks leave such an event to the Python hooks, which add it through the SDK."""
    tracer, go, entered, handed, _ = setup
    seen = 0
    for _ in range(20):
        span, events, c_hooks = _wait_in(tracer, go, entered, handed)
        if events:
            (name, attrs, _, _), = events
            (event,) = span.events
            kept = list(attrs.items())[-3:]
            assert (event.name, list(event.attributes.items())) == (name, [(k, _plain(v)) for k, v in kept])
            assert event.attributes.dropped == len(attrs) - 3
            assert not c_hooks
            seen += 1
    assert seen >= 10, f"only {seen} of 20 spans had a long wait"

"""Span math with a synthetic ring: what lands on a span, and when nothing does."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Optional

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_gil import ring as ringlib
from otel_gil import spans
from otel_gil.spans import GilSpanProcessor
from synthetic import make_ring, record_wait, slot_for


@dataclass
class FakeRegistration:
    ring: Optional[ringlib.Ring]
    status: str = "ok"
    generation: int = 1


def processor(reg, metrics=None, *, fast: bool) -> GilSpanProcessor:
    """The C hooks (otel_gil/_fastspan.c, built by ``pip install -e .``) or the Python ones."""
    if fast and spans._fastspan is None:
        pytest.fail("otel_gil._fastspan is not built: pip install -e . (needs a C compiler and Python.h)")
    made = GilSpanProcessor(reg, metrics, fast=fast)
    assert (made._hooks is None) is not fast
    return made


@pytest.fixture(params=[False, True], ids=["python-hooks", "c-hooks"])
def fast(request) -> bool:
    return request.param


@contextmanager
def hooked(reg: FakeRegistration, fast: bool, metrics=None, **provider_kwargs):
    """A TracerProvider with otel-gil's hooks on ``reg`` and an in-memory exporter: (tracer, processor, exporter)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(**provider_kwargs)
    gil = processor(reg, metrics, fast=fast)
    provider.add_span_processor(gil)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    spans.wrap_span_end(gil)
    try:
        yield provider.get_tracer("test"), gil, exporter
    finally:
        spans.unwrap_span_end()


@pytest.fixture
def setup(fast):
    ring = make_ring()
    reg = FakeRegistration(ring)
    with hooked(reg, fast) as (tracer, _, exporter):
        yield tracer, reg, ring, exporter


def my_slot(ring):
    return slot_for(ring, threading.get_native_id())


def test_figures_are_the_difference_over_the_span(setup):
    tracer, _, ring, exporter = setup
    s = my_slot(ring)
    s.wait_ns, s.hold_ns, s.acquisitions, s.convoy_waits = 7_000_000, 3_000_000, 10, 1
    with tracer.start_as_current_span("work"):
        s.wait_ns += 12_000_000
        s.hold_ns += 4_000_000
        s.acquisitions += 5
        s.convoy_waits += 2
        time.sleep(0.03)
    (span,) = exporter.get_finished_spans()
    a = span.attributes
    assert (a["gil.wait_ms"], a["gil.hold_ms"], a["gil.acquisitions"], a["gil.convoy_waits"]) == (12.0, 4.0, 5, 2)
    duration_ms = (span.end_time - span.start_time) / 1e6
    assert a["gil.wait_ratio"] == pytest.approx(12 / duration_ms, rel=0.05)
    assert a["gil.hold_ratio"] == pytest.approx(4 / duration_ms, rel=0.05)
    assert a["thread.id"] == threading.get_native_id()
    assert a["thread.name"] == threading.current_thread().name
    assert "gil.status" not in a


def test_open_hold_counts_up_to_span_end(setup):
    tracer, _, ring, exporter = setup
    s = my_slot(ring)
    s.acquired_ns = time.monotonic_ns()  # holding the GIL since before the span
    with tracer.start_as_current_span("hold"):
        time.sleep(0.02)
    (span,) = exporter.get_finished_spans()
    assert 19 <= span.attributes["gil.hold_ms"] <= (span.end_time - span.start_time) / 1e6


def test_long_waits_inside_the_span_become_events(setup):
    tracer, _, ring, exporter = setup
    s = my_slot(ring)
    release = threading.Event()
    blocker = threading.Thread(target=release.wait, name="metrics-hog")
    blocker.start()
    record_wait(s, 1_000, 3_000_000, blocker=blocker.native_id)  # before the span
    with tracer.start_as_current_span("io"):
        now = time.monotonic_ns()
        record_wait(s, now, now + 2_500_000, blocker=blocker.native_id)
        time.sleep(0.01)
    release.set()
    blocker.join()
    (span,) = exporter.get_finished_spans()
    (event,) = span.events
    assert event.name == "gil.wait"
    assert event.attributes["gil.wait_ms"] == 2.5
    assert event.attributes["gil.blocker.thread.name"] == "metrics-hog"
    assert event.attributes["gil.blocker.thread.id"] == blocker.native_id
    assert span.start_time <= event.timestamp <= span.end_time


def test_no_collector_sets_status_and_no_figures(setup):
    tracer, reg, _, exporter = setup
    reg.ring, reg.status = None, "no_collector"
    with tracer.start_as_current_span("x"):
        pass
    (span,) = exporter.get_finished_spans()
    assert span.attributes["gil.status"] == "no_collector"
    assert not [k for k in span.attributes if k.startswith("gil.") and k != "gil.status"]


def test_span_ended_on_another_thread_gets_no_figures(setup):
    tracer, _, ring, exporter = setup
    my_slot(ring)
    span = tracer.start_span("handoff")
    t = threading.Thread(target=span.end)
    t.start()
    t.join()
    (done,) = exporter.get_finished_spans()
    assert done.attributes["gil.status"] == "cross_thread"
    assert "gil.wait_ms" not in done.attributes


def test_collector_restart_during_the_span(setup):
    tracer, reg, _, exporter = setup
    with tracer.start_as_current_span("x"):
        reg.ring, reg.generation = make_ring(), reg.generation + 1
    (span,) = exporter.get_finished_spans()
    assert span.attributes["gil.status"] == "collector_changed"


def test_a_broken_ring_never_breaks_the_span(setup, caplog, monkeypatch):
    tracer, reg, _, exporter = setup
    monkeypatch.setattr(spans, "_logged", set())

    class Broken:
        def find(self, *_):
            raise RuntimeError("boom")

    reg.ring = Broken()
    for name in ("first", "second"):
        with tracer.start_as_current_span(name):
            pass
    assert [s.name for s in exporter.get_finished_spans()] == ["first", "second"]
    assert sum("reading the GIL ring failed" in r.getMessage() for r in caplog.records) == 1


def test_explicit_end_time_and_double_end(setup):
    tracer, _, ring, exporter = setup
    my_slot(ring)
    span = tracer.start_span("x")
    span.end(end_time=span.start_time + 1_000_000)
    span.end()  # the SDK warns; we add nothing to an ended span
    (done,) = exporter.get_finished_spans()
    assert done.attributes["gil.acquisitions"] == 0


def test_long_waits_before_a_backdated_start_are_counted(setup):
    """Flask's server span starts at the WSGI call, before the span object exists."""
    tracer, _, ring, exporter = setup
    s = my_slot(ring)
    now = time.monotonic_ns()
    record_wait(s, now - 90_000_000, now - 80_000_000, blocker=1)  # before the span
    record_wait(s, now - 40_000_000, now - 30_000_000, blocker=1)  # inside the backdated stretch
    with tracer.start_as_current_span("GET /io", start_time=time.time_ns() - 50_000_000):
        pass
    (span,) = exporter.get_finished_spans()
    a = span.attributes
    assert a["gil.wait_ms"] == 10.0
    assert a["gil.acquisitions"] == 1 and a["gil.convoy_waits"] == 1
    assert [e.attributes["gil.wait_ms"] for e in span.events] == [10.0]
    assert a["gil.wait_ratio"] == pytest.approx(10 / ((span.end_time - span.start_time) / 1e6), rel=0.01)


def test_server_spans_feed_the_wait_ratio_histogram(fast):
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.trace import SpanKind

    from otel_gil.metrics import GilMetrics

    reader = InMemoryMetricReader()
    ring = make_ring()
    reg = FakeRegistration(ring)
    gil_metrics = GilMetrics(reg, MeterProvider([reader]).get_meter("test"))
    with hooked(reg, fast, gil_metrics) as (tracer, _, exporter):
        s = my_slot(ring)
        with tracer.start_as_current_span("GET /io", kind=SpanKind.SERVER, attributes={"http.route": "/io"}):
            s.wait_ns += 8_000_000
            time.sleep(0.01)
        with tracer.start_as_current_span("internal"):
            pass
    server = next(span for span in exporter.get_finished_spans() if span.name == "GET /io")
    points = {
        m.name: m.data.data_points
        for rm in reader.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    (point,) = points["gil.wait_ratio"]
    assert point.attributes == {"http.route": "/io"} and point.count == 1
    assert point.sum == pytest.approx(server.attributes["gil.wait_ratio"], rel=1e-9)
    assert point.sum == pytest.approx(8e6 / (server.end_time - server.start_time), rel=0.01)
    (wait,) = points["gil.wait.time"]
    assert wait.attributes == {"thread.name": threading.current_thread().name}
    assert wait.value == pytest.approx(0.008)


def test_attribute_limits_hold(fast):
    """Where the span's limits would drop values, the figures go through set_attributes."""
    from opentelemetry.sdk.trace import SpanLimits

    ring = make_ring()
    with hooked(FakeRegistration(ring), fast, span_limits=SpanLimits(max_span_attributes=4)) as (tracer, _, exporter):
        my_slot(ring)
        with tracer.start_as_current_span("x", attributes={"app": 1}):
            pass
    (span,) = exporter.get_finished_spans()
    assert len(span.attributes) == 4 and span.dropped_attributes == 5, dict(span.attributes)


def test_a_shut_down_processor_adds_nothing(fast):
    ring = make_ring()
    with hooked(FakeRegistration(ring), fast) as (tracer, gil, exporter):
        my_slot(ring)
        gil.shutdown()
        with tracer.start_as_current_span("after"):
            pass
    (span,) = exporter.get_finished_spans()
    assert not [k for k in span.attributes if k.startswith(("gil.", "thread."))], dict(span.attributes)

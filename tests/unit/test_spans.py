"""Span math with a synthetic ring: what lands on a span, and when nothing does."""

from __future__ import annotations

import _thread
import functools
import logging
import os
import sys
import threading
import time
from contextlib import contextmanager
from typing import Optional

import pytest
import wrapt
from opentelemetry.sdk.trace import Span, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_gil import ring as ringlib
from otel_gil import spans, threads, wait_spans
from otel_gil.client import Registration, RingState
from otel_gil.semconv import (ALWAYS, COLLECTOR_CHANGED, END_PASSED, GIL_ACQUISITIONS, GIL_CONVOY_WAITS, GIL_HOLD_MS,
                              GIL_HOLD_RATIO, GIL_WAIT_MS, INCONSISTENT, NO_COLLECTOR, PENDING, REGISTERED, THREAD_NAME)
from otel_gil.spans import GilSpanProcessor
from synthetic import log_hold, log_location, make_ring, record_wait, ring_bytes, slot_for


class FakeRegistration(RingState):
    """A backend registered on ``ring``; tests change its state as a registrar would (``_publish``)."""

    def __init__(self, ring: Optional[ringlib.Ring]) -> None:
        super().__init__()
        self._publish(ring, REGISTERED, "")

    def check_fork(self) -> None:
        pass


def processor(reg, metrics=None, *, fast: bool, every: bool = False) -> GilSpanProcessor:
    """The C hooks (otel_gil/_fastspan.c, built by ``pip install -e .``) or the Python ones."""
    if fast and spans._fastspan is None:
        pytest.fail("otel_gil._fastspan is not built: pip install -e . (needs a C compiler and Python.h)")
    made = GilSpanProcessor(reg, metrics, fast=fast, every_attribute=every)
    assert (made._hooks is None) is not fast
    return made


@pytest.fixture(params=[False, True], ids=["python-hooks", "c-hooks"])
def fast(request) -> bool:
    return request.param


@contextmanager
def hooked(reg: FakeRegistration, fast: bool, metrics=None, every: bool = False, **provider_kwargs):
    """A TracerProvider with otel-gil's hooks on ``reg`` and an in-memory exporter: (tracer, processor, exporter)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(**provider_kwargs)
    gil = processor(reg, metrics, fast=fast, every=every)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    spans.hook_provider(provider, gil)
    threads.watch_starts()  # as instrument() does: blockers are named by who had their tid when
    try:
        yield provider.get_tracer("test"), gil, exporter
    finally:
        threads.unwatch_starts()
        spans.unwrap_span()


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
    assert a["thread.name"] == threading.current_thread().name
    assert "gil.status" not in a and "gil.hold_ratio" not in a  # hold_ms / duration: OTEL_GIL_ALL_ATTRIBUTES only


@pytest.mark.parametrize("every", [False, True], ids=["default", "all-attributes"])
def test_a_calm_span_carries_the_fewest_attributes(fast, every):
    """No acquisition, no convoy: semconv.ALWAYS alone; every figure with OTEL_GIL_ALL_ATTRIBUTES."""
    ring = make_ring()
    with hooked(FakeRegistration(ring), fast, every=every) as (tracer, _, exporter):
        s = my_slot(ring)
        with tracer.start_as_current_span("calm"):
            s.hold_ns += 1_000_000
            time.sleep(0.005)  # longer than the hold
    (span,) = exporter.get_finished_spans()
    extra = {GIL_HOLD_RATIO: pytest.approx(1e6 / (span.end_time - span.start_time), rel=0.05), GIL_ACQUISITIONS: 0,
             GIL_CONVOY_WAITS: 0}
    assert list(span.attributes) == [*ALWAYS, *(extra if every else ())], dict(span.attributes)
    assert span.attributes[GIL_HOLD_MS] == 1.0 and span.attributes[GIL_WAIT_MS] == 0.0
    assert {k: span.attributes[k] for k in extra if every} == (extra if every else {})


def test_thread_id_is_the_managed_id_logs_carry(setup):
    """Semantic conventions: ``thread.id`` is the managed id (``threading.get_ident()``), which
    is also what a ``logging.LogRecord`` of the same thread has (``record.thread``)."""
    tracer, reg, ring, exporter = setup
    my_slot(ring)
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    log = logging.getLogger("test-thread-id")
    log.addHandler(handler)

    def traced() -> None:
        with tracer.start_as_current_span("registered"):
            log.warning("in the span")
        reg._publish(None, NO_COLLECTOR, "")
        with tracer.start_as_current_span("unregistered"):
            pass

    worker = threading.Thread(target=traced, name="worker")
    worker.start()
    worker.join()
    log.removeHandler(handler)
    ids = {span.name: span.attributes["thread.id"] for span in exporter.get_finished_spans()}
    assert ids == {"registered": worker.ident, "unregistered": worker.ident}
    assert [r.thread for r in records] == [worker.ident]
    assert worker.ident != worker.native_id


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
    assert event.attributes["gil.blocker.thread.id"] == blocker.ident  # as that thread's spans have it
    assert event.attributes["gil.blocker.thread.native_id"] == blocker.native_id
    assert span.start_time <= event.timestamp <= span.end_time


def test_long_waits_blame_the_threads_that_held_the_gil_by_time(setup):
    """The last releaser (a peer that held it 0.2 ms) is not the blocker: the thread
    that held the GIL longest during the wait is, and the span's top blocker sums its waits."""
    tracer, _, ring, exporter = setup
    s = my_slot(ring)
    release, in_span = threading.Event(), threading.Event()

    def report() -> None:
        with tracer.start_as_current_span("GET /report"):
            in_span.set()
            release.wait()

    hog = threading.Thread(target=report, name="metrics-hog")
    peer = threading.Thread(target=release.wait, name="peer")
    hog.start(), peer.start()
    in_span.wait()
    with tracer.start_as_current_span("io"):
        t = time.monotonic_ns()
        log_hold(ring, hog.native_id, t - 1_000_000, t + 4_000_000)  # began before the wait
        log_hold(ring, peer.native_id, t + 4_100_000, t + 4_300_000)
        record_wait(s, t, t + 4_400_000, blocker=peer.native_id, held_ns=4_250_000, forced=True)
        log_hold(ring, hog.native_id, t + 5_000_000, t + 7_000_000)
        record_wait(s, t + 4_900_000, t + 7_100_000, blocker=hog.native_id, held_ns=2_050_000)
        time.sleep(0.01)
    release.set()
    hog.join(), peer.join()
    span, report_span = exporter.get_finished_spans()  # io ended first
    first, second = (e.attributes for e in span.events)
    # What the hog was doing: the span it has been in since before the wait.
    assert first["gil.blocker.span.name"] == "GET /report"
    assert first["gil.blocker.span_id"] == f"{report_span.context.span_id:016x}"
    assert first["gil.blocker.thread.name"] == "metrics-hog" and first["gil.blocker.thread.id"] == hog.ident
    assert first["gil.blocker.thread.native_id"] == hog.native_id
    assert list(first["gil.blockers.thread.native_id"]) == [hog.native_id, peer.native_id]
    assert first["gil.blocker.hold_ms"] == 4.0  # its part inside the wait only
    assert list(first["gil.blockers.thread.name"]) == ["metrics-hog", "peer"]
    assert list(first["gil.blockers.hold_ms"]) == [4.0, 0.2]
    assert first["gil.blockers.unrecorded_ms"] == 0.05  # 4.25 held, 4.2 of it logged
    assert first["gil.handoff_ms"] == 0.15
    assert first["gil.wait.forced_switch"] is True
    assert "gil.wait.forced_switch" not in second and second["gil.blocker.hold_ms"] == 2.0
    assert span.attributes["gil.top_blocker.thread.name"] == "metrics-hog"
    assert span.attributes["gil.top_blocker.thread.id"] == hog.ident
    assert span.attributes["gil.top_blocker.thread.native_id"] == hog.native_id
    assert span.attributes["gil.top_blocker.hold_ms"] == 6.0


def test_no_collector_sets_status_and_no_figures(setup):
    tracer, reg, _, exporter = setup
    reg._publish(None, NO_COLLECTOR, "")
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
        reg._publish(make_ring(), REGISTERED, "")
    (span,) = exporter.get_finished_spans()
    assert span.attributes["gil.status"] == "collector_changed"


def test_a_broken_ring_never_breaks_the_span(setup, caplog, monkeypatch):
    tracer, reg, _, exporter = setup
    monkeypatch.setattr(spans, "_logged", set())

    class Broken:
        def find(self, *_):
            raise RuntimeError("boom")

    reg._publish(Broken(), REGISTERED, "")
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
    assert list(done.attributes) == list(ALWAYS), dict(done.attributes)  # once, and counters at 0 left out


def test_an_end_time_in_the_past_closes_open_intervals_there(setup):
    """No hand-off since the explicit end: the open hold is counted up to it, not to the read."""
    tracer, _, ring, exporter = setup
    s = my_slot(ring)
    s.acquired_ns = time.monotonic_ns()  # holding the GIL throughout
    span = tracer.start_span("x")
    time.sleep(0.01)
    end = time.time_ns()
    time.sleep(0.03)  # held on after the span's end, before it is ended
    span.end(end_time=end)
    (done,) = exporter.get_finished_spans()
    duration_ms = (done.end_time - done.start_time) / 1e6
    assert done.end_time == end and 9 <= done.attributes["gil.hold_ms"] <= duration_ms, done.attributes


def test_an_end_time_the_thread_has_handed_the_gil_off_since_gets_no_figures(setup):
    """Hand-offs after an explicit end are in the counters and cannot be taken out: a status, no figures."""
    tracer, _, ring, exporter = setup
    s = my_slot(ring)
    s.acquired_ns = time.monotonic_ns()
    span = tracer.start_span("x")
    end = time.time_ns()
    time.sleep(0.01)
    s.hold_ns += time.monotonic_ns() - s.acquired_ns  # released after the end, and took it again
    s.acquisitions += 1
    s.acquired_ns = time.monotonic_ns()
    span.end(end_time=end)
    (done,) = exporter.get_finished_spans()
    assert done.attributes["gil.status"] == END_PASSED, done.attributes
    assert not [k for k in done.attributes if k.endswith(("_ms", "_ratio", "acquisitions", "convoy_waits"))]


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


def test_a_backdated_start_with_no_long_wait_in_its_stretch_stays_in_c(fast, monkeypatch):
    """A back-dated start whose stretch holds no long wait (the ring's last ended before it) gets
    the calm span's figures, from the C hooks too: no hand-over to the Python ones."""
    handed, python_end = [], spans.end_wrapper
    monkeypatch.setattr(spans, "end_wrapper", lambda *args: handed.append(args[1]) or python_end(*args))
    ring = make_ring()
    with hooked(FakeRegistration(ring), fast) as (tracer, _, exporter):
        now = time.monotonic_ns()
        record_wait(my_slot(ring), now - 90_000_000, now - 80_000_000, blocker=1)  # before the stretch
        with tracer.start_as_current_span("GET /io", start_time=time.time_ns() - 50_000_000):
            pass
    (span,) = exporter.get_finished_spans()
    assert span.attributes["gil.wait_ms"] == 0.0 and not span.events, span.attributes
    assert not handed if fast else handed  # (the Python hooks: every span through it)


def test_a_long_wait_in_a_backdated_span_is_blamed_alike_by_both_hooks(fast, monkeypatch):
    """One long wait of its own in a back-dated span (an older one before its stretch in the
    ring), two holders logged, the longest one's location: the same event and top blocker from
    either hooks, the C ones (otel_gil/long_waits.c) without handing the span over."""
    handed, python_end = [], spans.end_wrapper
    monkeypatch.setattr(spans, "end_wrapper", lambda *args: handed.append(args[1]) or python_end(*args))
    ring = make_ring()
    release = threading.Event()
    with hooked(FakeRegistration(ring), fast) as (tracer, _, exporter):
        hog, peer = (threading.Thread(target=release.wait, name=name) for name in ("hog", "peer"))
        hog.start(), peer.start()
        s = my_slot(ring)
        now = time.monotonic_ns()
        record_wait(s, now - 90_000_000, now - 80_000_000, blocker=1)  # before the stretch
        with tracer.start_as_current_span("GET /io", start_time=time.time_ns() - 50_000_000):
            t = time.monotonic_ns()
            log_hold(ring, hog.native_id, t - 1_000_000, t + 3_000_000)
            log_location(ring, ring.header.holds_written - 1, [("spin", "/app/hog.py", 12), ("run", "/lib/t.py", 0)])
            log_hold(ring, peer.native_id, t + 3_100_000, t + 4_300_000)
            record_wait(s, t, t + 4_400_000, blocker=peer.native_id, held_ns=4_250_000, forced=True)
            time.sleep(0.006)  # past the wait's end
        release.set()
        hog.join(), peer.join()
    (span,) = exporter.get_finished_spans()
    assert dict(span.events[0].attributes) == {
        "gil.wait_ms": 4.4, "gil.blocker.thread.native_id": hog.native_id, "gil.blocker.thread.id": hog.ident,
        "gil.blocker.thread.name": "hog", "gil.blocker.hold_ms": 3.0,
        "gil.blockers.thread.native_id": (hog.native_id, peer.native_id), "gil.blockers.thread.name": ("hog", "peer"),
        "gil.blockers.hold_ms": (3.0, 1.2), "gil.blockers.others_ms": 0.0, "gil.blocker.code.function.name": "spin",
        "gil.blocker.code.file.path": "/app/hog.py", "gil.blocker.code.line.number": 12,
        "gil.blocker.code.stacktrace": "spin (/app/hog.py:12)\nrun (/lib/t.py:?)", "gil.blockers.unrecorded_ms": 0.05,
        "gil.handoff_ms": 0.15, "gil.wait.forced_switch": True}
    assert {k: v for k, v in span.attributes.items() if k.startswith("gil.top_blocker")} == {
        "gil.top_blocker.thread.native_id": hog.native_id, "gil.top_blocker.thread.id": hog.ident,
        "gil.top_blocker.thread.name": "hog", "gil.top_blocker.hold_ms": 3.0,
        "gil.top_blocker.code.function.name": "spin", "gil.top_blocker.code.file.path": "/app/hog.py",
        "gil.top_blocker.code.line.number": 12}
    assert span.attributes["gil.wait_ms"] == 4.4
    assert not handed if fast else handed  # (the Python hooks: every span through it)


def test_server_spans_feed_the_wait_ratio_histogram(fast):
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.trace import SpanKind

    from otel_gil.metrics import GilMetrics

    reader = InMemoryMetricReader()
    ring = make_ring()
    reg = FakeRegistration(ring)
    gil_metrics = GilMetrics(reg, MeterProvider([reader]).get_meter("test"), fast)
    with hooked(reg, fast, gil_metrics) as (tracer, _, exporter):
        s = my_slot(ring)
        with tracer.start_as_current_span("GET /io", kind=SpanKind.SERVER, attributes={"http.route": "/io"}):
            s.wait_ns += 8_000_000
            time.sleep(0.01)
        with tracer.start_as_current_span("internal"):
            pass
    server = next(x for x in exporter.get_finished_spans() if x.name == "GET /io")
    ratio = server.attributes["gil.wait_ratio"]
    assert ratio == pytest.approx(8e6 / (server.end_time - server.start_time), rel=0.01)
    points = {
        m.name: m.data.data_points
        for rm in reader.get_metrics_data().resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }
    buckets = {p.attributes["le"]: p.value for p in points["gil.wait_ratio.bucket"]}
    assert all(p.attributes["http.route"] == "/io" for p in points["gil.wait_ratio.bucket"])
    # Cumulative: 0 up to the bucket of this span's ratio, 1 from there on (+Inf included).
    assert buckets == {le: int(le == "+Inf" or ratio <= float(le)) for le in buckets}, (ratio, buckets)
    assert len(buckets) == 10 and 0 < ratio < 1
    ((count,), (total,)) = points["gil.wait_ratio.count"], points["gil.wait_ratio.sum"]
    assert count.value == 1 and count.attributes == {"http.route": "/io"}
    assert total.value == pytest.approx(ratio, rel=1e-9)
    (wait,) = points["gil.wait.time"]
    assert wait.attributes == {"thread.name": threading.current_thread().name}
    assert wait.value == pytest.approx(0.008)


@pytest.mark.parametrize("broken", ["wait_over_duration", "hold_went_down"])
def test_figures_that_break_an_invariant_are_dropped_and_counted(fast, broken):
    """A slot that says the thread waited 80 ms in a 5 ms span (or whose hold went back):
    no figure is exported, gil.status says why, gil.spans.dropped counts it."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from otel_gil.metrics import GilMetrics

    reader = InMemoryMetricReader()
    ring = make_ring()
    reg = FakeRegistration(ring)
    with hooked(reg, fast, GilMetrics(reg, MeterProvider([reader]).get_meter("test"), fast)) as (tracer, _, exporter):
        s = my_slot(ring)
        s.hold_ns = 50_000_000
        with tracer.start_as_current_span("impossible"):
            if broken == "wait_over_duration":
                s.wait_ns += 80_000_000
            else:
                s.hold_ns -= 1_000_000
            time.sleep(0.005)
    (span,) = exporter.get_finished_spans()
    assert span.attributes["gil.status"] == INCONSISTENT
    assert not [k for k in span.attributes if k.startswith("gil.") and k != "gil.status"], span.attributes
    assert span.attributes["thread.name"] == threading.current_thread().name
    (dropped,) = [p for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics
                  for m in sm.metrics if m.name == "gil.spans.dropped" for p in m.data.data_points]
    assert (dropped.attributes, dropped.value) == ({"reason": INCONSISTENT}, 1)


def test_the_c_hooks_allow_the_slack_the_python_hooks_do():
    if spans._fastspan is None:
        pytest.fail("otel_gil._fastspan is not built: pip install -e . (needs a C compiler and Python.h)")
    assert spans._fastspan.CLOCK_SLACK_NS == spans.CLOCK_SLACK_NS


def test_wait_ratio_routes_are_bounded_and_buckets_exact(fast):
    from otel_gil.metrics import _BUCKET_LABELS, MAX_ROUTES, OTHER_ROUTES, WaitRatios

    ratios = WaitRatios(fast)
    assert type(ratios.counter).__name__ == ("RatioCounter" if fast else "method")
    for ratio in (0.0, 0.01, 0.011, 0.3, 1.0, 1.5):  # le is inclusive: 0.01 counts in le="0.01"
        ratios.counter(ratio, "/io")
    for i in range(MAX_ROUTES + 50):
        ratios.counter(0.5, f"/item/{i}")
    rows = {route: (cumulative, count, total) for route, cumulative, count, total in ratios.rows()}
    assert len(rows) == MAX_ROUTES + 1 and rows[OTHER_ROUTES][1] == 51
    cumulative, count, total = rows["/item/0"]
    assert count == 1 and total == 0.5 and cumulative == [0] * 5 + [1] * 5  # le=0.5 onwards
    cumulative, count, total = rows["/io"]
    assert dict(zip(_BUCKET_LABELS, cumulative)) == {
        "0.01": 2, "0.05": 3, "0.1": 3, "0.2": 3, "0.3": 4, "0.5": 4, "0.7": 4, "0.9": 4, "1.0": 5, "+Inf": 6}
    assert count == 6 and total == pytest.approx(2.821)


@pytest.mark.parametrize("limit", [None, 4], ids=["no-limit", "limit-4"])
def test_figures_land_as_set_attributes_leaves_them(fast, limit):
    """Written in one pass, the figures leave what set_attributes would: a key the app had set
    moves to the end, a limit drops the oldest and counts them."""
    from opentelemetry.sdk.trace import SpanLimits

    ring = make_ring()
    own = {"gil.wait_ms": -1.0, "app": 1}
    limits = SpanLimits(max_span_attributes=limit)
    with hooked(FakeRegistration(ring), fast, span_limits=limits) as (tracer, _, exporter):
        my_slot(ring)
        with tracer.start_as_current_span("x", attributes=own):
            pass
    (span,) = exporter.get_finished_spans()
    written = {THREAD_NAME: threading.current_thread().name}  # (the oldest of ours: a limit of 4 drops it)
    written.update({k: span.attributes[k] for k in ALWAYS if k in span.attributes})
    reference = TracerProvider(span_limits=limits).get_tracer("reference").start_span("x", attributes=own)
    reference.set_attributes(written)
    assert list(span.attributes.items()) == list(reference.attributes.items())
    assert span.dropped_attributes == reference.dropped_attributes == (0 if limit is None else 2)


WRITERS = {True: "set_attributes", False: "_set_attributes"}  # where the hooks wait for the span's lock


def test_a_span_whose_lock_another_thread_holds_gets_its_figures_through_that_lock(fast):
    """The figures go straight into the attribute dict only while nobody holds the span's lock (the
    C hooks read the lock's state in place): with another thread in it, the span's end waits for
    it in set_attributes (the Python hooks': in _set_attributes), and nothing is written before."""
    ring = make_ring()
    with hooked(FakeRegistration(ring), fast) as (tracer, _, exporter):
        my_slot(ring)
        span = tracer.start_span("x")
        held, seen = threading.Event(), []
        main = threading.get_ident()

        def holder() -> None:
            with span._lock:
                held.set()
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:  # until the end waits for this lock in set_attributes
                    frame = sys._current_frames().get(main)
                    if frame is not None and frame.f_code.co_name == WRITERS[fast]:
                        break
                    time.sleep(0.001)
                seen.append((frame.f_code.co_name, [k for k in span._attributes if k.startswith("gil.")]))

        thread = threading.Thread(target=holder)
        thread.start()
        assert held.wait(10)
        span.end()
        thread.join()
    assert seen == [(WRITERS[fast], [])]
    (ended,) = exporter.get_finished_spans()
    assert set(ALWAYS) <= set(ended.attributes), dict(ended.attributes)


def test_a_shut_down_processor_adds_nothing(fast):
    ring = make_ring()
    with hooked(FakeRegistration(ring), fast) as (tracer, gil, exporter):
        my_slot(ring)
        gil.shutdown()
        with tracer.start_as_current_span("after"):
            pass
    (span,) = exporter.get_finished_spans()
    assert not [k for k in span.attributes if k.startswith(("gil.", "thread."))], dict(span.attributes)


def registered_provider() -> tuple[FakeRegistration, TracerProvider, InMemorySpanExporter]:
    """A registration whose ring has this thread's slot, and a provider (not hooked yet) with an in-memory exporter."""
    ring = make_ring()
    my_slot(ring)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return FakeRegistration(ring), provider, exporter


def test_a_start_in_flight_across_a_reinstrument_keeps_its_snapshot():
    """A thread looked Span.start up, lost the GIL, and an uninstrument() and instrument() ran
    meanwhile (the soak saw one span in 30 minutes): the stale hook hands the call to the
    class's current one, and the span gets its figures."""
    reg, provider, exporter = registered_provider()
    first = processor(reg, fast=True)
    spans.hook_provider(provider, first)
    stale = Span.__dict__["start"]  # what the thread had looked up
    try:
        spans.unwrap_span()  # uninstrument()
        first.shutdown()
        spans.hook_provider(provider, processor(reg, fast=True))  # instrument() again
        current = Span.__dict__["start"]
        Span.start = lambda self, *args, **kwargs: None  # start_span builds the span, not yet started
        try:
            span = provider.get_tracer("test").start_span("x")
        finally:
            Span.start = current
        stale(span)  # the call in flight
        span.end()
    finally:
        spans.unwrap_span()
    (done,) = exporter.get_finished_spans()
    assert list(done.attributes) == list(ALWAYS), dict(done.attributes)  # figures, no status


def _wrap_theirs(kind: str, calls: list) -> None:
    """Another library's wrappers of Span.start and Span.end: wrapt's (re-pointable), or functions
    of functools.wraps (not: a closure keeps what each wrapped). Each call is noted in ``calls``."""

    def wrapper(wrapped, instance, args, kwargs):
        calls.append(wrapped.__name__)
        return wrapped(*args, **kwargs)

    for name in ("start", "end"):
        if kind == "wrapt":
            wrapt.wrap_function_wrapper(Span, name, wrapper)
        else:
            inner = getattr(Span, name)  # as a library writes it: original = Span.end

            @functools.wraps(inner)
            def method(self, *args, _inner=inner, _name=name, **kwargs):
                calls.append(_name)
                return _inner(self, *args, **kwargs)

            setattr(Span, name, method)


@pytest.mark.parametrize("theirs", ["wrapt", "function"])
@pytest.mark.parametrize("order", ["ours-first", "theirs-first"])
def test_uninstrument_takes_out_only_ours_beside_another_wrapper(fast, theirs, order):
    """Span.start and Span.end wrapped by another library too, before or after us: unwrap_span
    (uninstrument) takes out only ours, theirs still runs, and a span gets figures only while we
    are instrumented. A wrapper that cannot be re-pointed keeps ours inside it: passing through."""
    originals = {name: Span.__dict__[name] for name in ("start", "end")}
    reg, provider, exporter = registered_provider()
    calls: list = []
    try:
        if order == "theirs-first":
            _wrap_theirs(theirs, calls)
        first = processor(reg, fast=fast)
        spans.hook_provider(provider, first)
        if order == "ours-first":
            _wrap_theirs(theirs, calls)
        tracer = provider.get_tracer("test")
        tracer.start_span("hooked").end()
        spans.unwrap_span()  # uninstrument()
        first.enabled = False
        for name in ("start", "end"):
            # ours inside their closure stays (the Python hooks wrap Span.end alone)
            stays = theirs == "function" and order == "ours-first" and (fast or name == "end")
            chain, current = [], Span.__dict__[name]
            while current is not None:
                chain.append(current)
                current = getattr(current, "__wrapped__", None)
            assert chain[-1] is originals[name] and len(chain) == (3 if stays else 2), (name, chain)
        calls.clear()
        tracer.start_span("unhooked").end()
        assert calls == ["start", "end"]  # theirs, once each
        spans.hook_provider(provider, processor(reg, fast=fast))  # instrument() again
        tracer.start_span("again").end()
        spans.unwrap_span()
    finally:
        for name, method in originals.items():
            setattr(Span, name, method)
    hooked, unhooked, again = exporter.get_finished_spans()
    assert GIL_WAIT_MS in hooked.attributes and GIL_WAIT_MS in again.attributes
    assert not [k for k in unhooked.attributes if k.startswith(("gil.", "thread."))], dict(unhooked.attributes)


def test_only_the_hooked_providers_spans_get_figures(setup):
    """The C hooks replace Span.start and Span.end for every provider; they act on the
    instrumented provider's spans alone."""
    tracer, _, ring, exporter = setup
    my_slot(ring)
    other = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(other))
    with provider.get_tracer("other").start_as_current_span("elsewhere"):
        with tracer.start_as_current_span("here"):
            pass
    (elsewhere,) = other.get_finished_spans()
    (here,) = exporter.get_finished_spans()
    assert not [k for k in elsewhere.attributes if k.startswith(("gil.", "thread."))], dict(elsewhere.attributes)
    assert "gil.wait_ms" in here.attributes


def test_a_repeated_start_keeps_the_first_snapshot(setup):
    tracer, _, ring, exporter = setup
    s = my_slot(ring)
    span = tracer.start_span("twice")
    s.wait_ns += 5_000_000
    time.sleep(0.006)  # as long as the wait, at least: the figures must be possible
    span.start()  # the SDK warns and keeps its start time: so do the figures
    span.end()
    (done,) = exporter.get_finished_spans()
    assert done.attributes["gil.wait_ms"] == 5.0


def test_a_snapshot_reads_the_wall_clock_as_time_ns_does(setup):
    """The C hooks keep the wall clock's offset from the monotonic one a second (NTP slews both
    alike): each snapshot, and each span's end time, still lies between time_ns() before and after
    its span started (ended), within a second of the last read and past it (a new read)."""
    tracer = setup[0]
    for pause in (0.0, 0.0, 1.1, 0.0, 0.6, 0.6):  # the last read's offset, a second's, a new read's; one read at the end
        time.sleep(pause)
        mono0, wall0 = time.monotonic_ns(), time.time_ns()
        span = tracer.start_span("clocks")
        mono1, wall1 = time.monotonic_ns(), time.time_ns()
        start = span._otel_gil_start
        time.sleep(pause)
        wall2 = time.time_ns()
        span.end()
        wall3 = time.time_ns()
        assert mono0 <= start.mono_ns <= mono1
        assert wall0 - 1_000 <= start.wall_ns <= wall1 + 1_000  # (the offset's two reads: ~20 ns apart)
        assert wall2 - 1_000 <= span.end_time <= wall3 + 1_000


def test_thread_names_follow_renames_and_threads_python_did_not_start(setup):
    tracer, _, ring, exporter = setup
    names, kinds = [], []

    def traced() -> None:
        my_slot(ring)
        with tracer.start_as_current_span("before"):
            pass
        names.append(threading.current_thread().name)
        kinds.append(type(threading.current_thread()))
        threading.current_thread().name = "renamed"
        with tracer.start_as_current_span("after"):
            pass

    worker = threading.Thread(target=traced, name="worker")
    worker.start()
    worker.join()
    done = threading.Event()
    _thread.start_new_thread(lambda: (traced(), done.set()), ())
    assert done.wait(5)
    by_span = [(span.name, span.attributes["thread.name"]) for span in exporter.get_finished_spans()]
    # names[1] is Dummy-N, or "renamed" where the thread got the ident of an earlier test's
    # renamed dummy thread, which Python keeps in threading._active (3.11): ours as Python's.
    assert by_span == [("before", "worker"), ("after", "renamed"), ("before", names[1]), ("after", "renamed")]
    assert kinds[1] is threading._DummyThread


def test_a_new_registration_reads_its_own_ring_not_a_slot_found_in_the_last_ones(fast):
    """A second registration in one process (``uninstrument()`` then ``instrument()``, a test's
    fake) has a ring of its own: the slot index a thread found in the first ring is not used on
    it (its first generation once equalled the first one's, and an index past the smaller ring's
    end lost the span its figures: ``struct.error``)."""
    past = ringlib.entries(16)  # the second ring: 16 slots and the hold log, 1,169 entries

    def spans() -> dict:
        tid = threading.get_native_id()
        second = make_ring(16)
        first = make_ring(next(n for n in range(1300, 4000) if tid % n >= past))
        slot_for(first, tid)  # at its home, tid % nslots: past all of the second ring
        with hooked(FakeRegistration(first), fast) as (tracer, _, exporter):
            tracer.start_span("first").end()
        s = slot_for(second, tid)
        with hooked(FakeRegistration(second), fast) as (tracer, _, exporter):
            with tracer.start_as_current_span("second"):
                s.hold_ns += 3_000_000
                time.sleep(0.004)
        (span,) = exporter.get_finished_spans()
        return dict(span.attributes)

    attributes = in_a_thread_with_tid_from(past, spans)
    assert attributes.get(GIL_HOLD_MS) == 3.0, attributes


def in_a_thread_with_tid_from(low: int, run):
    """run() in a thread whose kernel id is ``low`` or more (a machine whose pids wrapped gives
    small ones): threads are started until one is; what run returns, or raises."""
    done: dict = {}

    def body():
        if threading.get_native_id() >= low:
            try:
                done["value"] = run()
            except BaseException as e:  # (raised in the caller's thread below)
                done["error"] = e
    for _ in range(low + 100):  # (the kernel gives ids upward from its last: low of them reach it)
        t = threading.Thread(target=body)
        t.start()
        t.join()
        if done:
            break
    if "error" in done:
        raise done["error"]
    assert "value" in done, f"no thread got a kernel id of {low} or more"
    return done["value"]


def seen_both(exporter) -> bool:
    statuses = {s.attributes.get("gil.status") for s in exporter.get_finished_spans()}
    return None in statuses and NO_COLLECTOR in statuses


def test_a_registration_changing_under_the_snapshot_never_shows_ok(fast):
    """The registrar thread swaps rings while spans start, and releasing a mapped ring
    (munmap through ctypes) lets other threads run: a span sees the old ring and status or
    the new ones, never one of each (uWSGI in CI: a worker's span said gil.status=ok with
    no figures)."""
    reg = Registration("/nonexistent/otel-gil.sock")
    reg.quiet = True
    reg._stop.set()  # no registrar thread of its own: flip() below plays it
    data, stop = ring_bytes(), threading.Event()

    def mapped() -> ringlib.Ring:
        fd = os.memfd_create("otel-gil-test-ring")
        try:
            os.write(fd, data)
            return ringlib.Ring.map_fd(fd, len(data))
        finally:
            os.close(fd)

    def flip():
        while not stop.is_set():
            reg._set(mapped(), REGISTERED, "")
            time.sleep(0.0002)  # spans start while registered, too
            reg._set(None, NO_COLLECTOR, "gone")

    flipper = threading.Thread(target=flip, daemon=True)
    with hooked(reg, fast) as (tracer, _, exporter):
        flipper.start()
        try:  # 3,000 spans, and more until both states were seen (a loaded machine may not switch threads sooner)
            deadline = time.monotonic() + 30
            while len(exporter.get_finished_spans()) < 3000 or (
                    not seen_both(exporter) and time.monotonic() < deadline):
                for _ in range(100):
                    tracer.start_span("x").end()
        finally:
            stop.set()
            flipper.join()
    statuses = [s.attributes.get("gil.status") for s in exporter.get_finished_spans()]
    assert REGISTERED not in statuses, statuses.count(REGISTERED)
    assert set(statuses) <= {None, PENDING, NO_COLLECTOR, COLLECTOR_CHANGED}, set(statuses)
    assert seen_both(exporter), "spans saw both states"


@pytest.fixture
def wait_spans_at(request):
    """wait_spans' threshold for one test (the instrumentor sets it; the hooks here do not)."""
    def at(ms: float) -> None:
        wait_spans.configure(ms)
    yield at
    wait_spans.configure(0)


def test_each_wait_names_its_longest_holders_code_and_becomes_a_child_span(setup, wait_spans_at):
    """The code of the hold that overlapped the wait most (not of the holder's other holds,
    nor of the last releaser); a location that is gone gives no code.* attribute at all."""
    tracer, _, ring, exporter = setup
    wait_spans_at(2)
    s = my_slot(ring)
    hog, peer = 4242, 4343
    with tracer.start_as_current_span("io") as io:
        t = time.monotonic_ns()
        log_hold(ring, hog, t - 1_000_000, t + 1_000_000)  # 1 ms inside the first wait
        log_location(ring, 0, [("Stats.poll", "/srv/stats.py", 7)])
        log_hold(ring, hog, t + 1_100_000, t + 4_000_000)  # 2.9 ms: the one that names the code
        log_location(ring, 1, [("Stats.compute_stats", "/srv/stats.py", 42), ("run", "/srv/módulo.py", 3)])
        log_hold(ring, peer, t + 4_000_000, t + 4_100_000)  # the last releaser
        log_location(ring, 2, [("peer", "/srv/peer.py", 1)])
        record_wait(s, t, t + 4_200_000, blocker=peer, held_ns=4_000_000)
        log_hold(ring, hog, t + 5_000_000, t + 6_000_000)  # its location never written: gone
        record_wait(s, t + 4_900_000, t + 6_100_000, blocker=hog, held_ns=1_000_000)
        time.sleep(0.01)
    io_context = io.get_span_context()
    finished = exporter.get_finished_spans()
    (span,) = [x for x in finished if x.name == "io"]
    first, second = (e.attributes for e in span.events)
    assert first["gil.blocker.thread.native_id"] == hog
    assert (first["gil.blocker.code.function.name"], first["gil.blocker.code.file.path"],
            first["gil.blocker.code.line.number"]) == ("Stats.compute_stats", "/srv/stats.py", 42)
    assert first["gil.blocker.code.stacktrace"] == "Stats.compute_stats (/srv/stats.py:42)\nrun (/srv/módulo.py:3)"
    assert second["gil.blocker.thread.native_id"] == hog and not any(k.startswith("gil.blocker.code") for k in second)
    assert span.attributes["gil.top_blocker.code.function.name"] == "Stats.compute_stats"
    assert span.attributes["gil.top_blocker.code.line.number"] == 42
    # The first wait (4.2 ms >= 2) is a child span covering it exactly; the second (1.2 ms) is not.
    (child,) = [x for x in finished if x.name == "gil.wait"]
    assert child.parent.span_id == io_context.span_id and child.context.trace_id == io_context.trace_id
    assert child.end_time - child.start_time == 4_200_000 and child.start_time == span.events[0].timestamp
    thread = {k: span.attributes[k] for k in ("thread.id", "thread.name")}
    assert dict(child.attributes) == {**thread, **first} and not child.events
    assert child.instrumentation_scope.name == "otel_gil"


def test_wait_spans_are_bounded_by_the_slots_ring(setup, wait_spans_at):
    """40 long waits in a span: the slot keeps the last RING_LEN, each an event and a child
    span; the span counts the others in gil.long_waits_dropped."""
    tracer, _, ring, exporter = setup
    wait_spans_at(1)
    s = my_slot(ring)
    with tracer.start_as_current_span("io"):
        t = time.monotonic_ns()
        for i in range(40):
            record_wait(s, t + i * 3_000_000, t + i * 3_000_000 + 2_000_000, blocker=1)
        time.sleep(0.13)
    finished = exporter.get_finished_spans()
    (span,) = [x for x in finished if x.name == "io"]
    children = sorted((x for x in finished if x.name == "gil.wait"), key=lambda x: x.start_time)
    assert len(span.events) == len(children) == ringlib.RING_LEN
    assert span.attributes["gil.long_waits_dropped"] == 40 - ringlib.RING_LEN
    assert [c.start_time for c in children] == [e.timestamp for e in span.events]


def test_no_wait_spans_when_turned_off(setup, wait_spans_at):
    tracer, _, ring, exporter = setup
    wait_spans_at(0)
    s = my_slot(ring)
    with tracer.start_as_current_span("io"):
        t = time.monotonic_ns()
        record_wait(s, t, t + 50_000_000, blocker=1)
        time.sleep(0.06)
    assert [x.name for x in exporter.get_finished_spans()] == ["io"]


def test_only_locations_gone_from_the_ring_count_as_gone():
    """A location the writer could not take has no frames and is counted by the writer, by why;
    the span side counts only the waits whose location was gone from the ring (``gone``)."""
    from otel_gil.blame import Blame, unlocated

    wait = ringlib.Wait(0, 5_000_000, 1, 5_000_000, 0)
    missed = ringlib.Location((), ("no_frame",))
    named = ringlib.Location((ringlib.Frame("f", "f.py", 1),), ())
    blames = [Blame(wait, [(1, 5_000_000)], 0, 0, location) for location in (None, missed, named)]
    blames.append(Blame(wait, [], 5_000_000, 0, None))  # no hold logged: nothing to locate
    assert unlocated(blames) == 1

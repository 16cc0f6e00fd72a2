"""``free_threading.UntilGilOn``, the backend of a free-threaded build running without its GIL,
on this build: nothing turns a GIL on here, so ``gil_on_for_good`` (and the one call a span
start makes) answer as CPython would once something did. The real thing, on a free-threaded
build, both backends: tests/integration/test_free_threaded_gil.py."""

from __future__ import annotations

import _imp
import importlib.util
import logging
import threading
from importlib.machinery import ExtensionFileLoader

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_gil import free_threading
from otel_gil.metrics import GilMetrics
from synthetic import make_ring
from test_spans import FakeRegistration, hooked, my_slot

EXTENSION = "_json"  # any extension module: its loader is where CPython turns the GIL on


@pytest.fixture
def gil(monkeypatch) -> list:
    """[on]: the GIL as this test says it is (off at first); on is on for good."""
    on = [False]
    monkeypatch.setattr(free_threading, "gil_on_for_good", lambda: on[0])
    monkeypatch.setattr(free_threading, "_is_gil_enabled", lambda: on[0])
    monkeypatch.setattr(free_threading, "free_threaded", lambda: True)
    return on


@pytest.fixture
def turning_import(monkeypatch, gil):
    """import_(): an extension import whose init turns the GIL on (CPython's create_dynamic)."""
    real = _imp.create_dynamic

    def create_dynamic(*args):
        module = real(*args)
        gil[0] = True
        return module

    monkeypatch.setattr(_imp, "create_dynamic", create_dynamic)
    spec = importlib.util.find_spec(EXTENSION)
    return lambda: spec.loader.create_module(spec)


class Started(FakeRegistration):
    """The backend UntilGilOn starts: a registration on ``ring``; ``stopped`` counts stop()s."""

    def __init__(self, ring) -> None:
        super().__init__(ring)
        self.stopped = 0

    def stop(self) -> None:
        self.stopped += 1

    def wait(self, timeout: float) -> bool:
        return True


def test_an_import_that_turns_the_gil_on_starts_the_backend(gil, turning_import, caplog):
    ring = make_ring()
    registered, started = Started(ring), []
    original = ExtensionFileLoader.__dict__["create_module"]
    reader = InMemoryMetricReader()
    until = free_threading.UntilGilOn("auto", lambda: started.append(threading.current_thread()) or registered)
    metrics = GilMetrics(until, MeterProvider([reader]).get_meter("test"), fast=False)
    gauge = []
    try:
        with hooked(until, False, metrics) as (tracer, _, exporter):
            with tracer.start_as_current_span("before"):
                pass
            gauge.append(_gauge(reader))
            with tracer.start_as_current_span("across"), caplog.at_level(logging.WARNING, "otel_gil"):
                turning_import()
                assert until.wait(10)
            my_slot(ring)
            with tracer.start_as_current_span("after"):
                pass
            gauge.append(_gauge(reader))
    finally:
        until.stop()
    assert ExtensionFileLoader.__dict__["create_module"] is original  # stop() took our wrapper out
    assert started == [until._starter] and until.state is registered.state  # started off the app's thread
    assert registered.stopped == 1
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert spans["before"].attributes["gil.status"] == "gil_disabled"
    across = spans["across"]
    assert {k: v for k, v in across.attributes.items() if k.startswith("gil.")} == {"gil.status": "gil_turned_on"}
    [event] = across.events
    assert (event.name, dict(event.attributes)) == ("gil.enabled", {"gil.enabled_by": EXTENSION})
    assert across.start_time <= event.timestamp <= across.end_time
    assert "gil.status" not in spans["after"].attributes and spans["after"].attributes["gil.hold_ms"] == 0
    [line] = [r.getMessage() for r in caplog.records]
    spec = importlib.util.find_spec(EXTENSION)
    assert line.startswith(f"otel-gil: importing {EXTENSION} ({spec.origin}) turned the GIL of this free-threaded "
                           "build on, at "), line
    assert gauge == [[], [(1, {"gil.enabled_by": EXTENSION})]]


def test_the_import_does_not_wait_for_the_backend(gil, turning_import):
    """The import records the switch; the backend starts on our thread, however long it takes
    (a collector that accepts and never answers): the import returns meanwhile."""
    release = threading.Event()
    until = free_threading.UntilGilOn("auto", lambda: release.wait(10) and Started(make_ring()))
    importer = threading.Thread(target=turning_import)
    try:
        importer.start()
        importer.join(5)
        assert not importer.is_alive() and until.turned_on.module == EXTENSION
        assert until.state.status == "pending"  # spans that start meanwhile
    finally:
        release.set()
        until.stop()
        importer.join()


def test_a_gil_turned_on_by_other_means_is_seen_at_the_next_span_start(gil, caplog):
    """No import we watch (``_imp.create_dynamic`` called directly, a loader of its own): the
    next span start sees the GIL on for good, and the backend starts; no module is named."""
    registered = Started(make_ring())
    until = free_threading.UntilGilOn("auto", lambda: registered)
    reader = InMemoryMetricReader()
    metrics = GilMetrics(until, MeterProvider([reader]).get_meter("test"), fast=False)
    try:
        with hooked(until, False, metrics) as (tracer, _, exporter), caplog.at_level(logging.WARNING, "otel_gil"):
            with tracer.start_as_current_span("off"):
                gil[0] = True
            with tracer.start_as_current_span("seen"):
                pass
            assert until.wait(10)
            with tracer.start_as_current_span("measured"):
                pass
    finally:
        until.stop()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert spans["off"].attributes["gil.status"] == "gil_disabled"  # its start saw the GIL off; its end does not look
    assert spans["seen"].attributes["gil.status"] == "pending"
    assert "gil.status" not in spans["measured"].attributes
    assert until.state is registered.state and until.turned_on.module == ""
    [line] = [r.getMessage() for r in caplog.records]
    assert "something other than an extension import otel-gil watches" in line, line
    assert _gauge(reader) == [(1, {})]


def test_uninstrument_while_the_backend_starts_stops_what_it_started(gil, turning_import):
    """stop() during start(): one lock for both, so what start() started is stopped."""
    entered, release = threading.Event(), threading.Event()
    registered = Started(make_ring())

    def start():
        entered.set()
        release.wait(10)
        return registered

    until = free_threading.UntilGilOn("auto", start)
    importer = threading.Thread(target=turning_import)
    importer.start()
    assert entered.wait(10)
    stopper = threading.Thread(target=until.stop)
    stopper.start()
    stopper.join(0.2)
    release.set()
    stopper.join(10)
    importer.join(10)
    assert registered.stopped == 1 and not until._starter.is_alive()


def _gauge(reader: InMemoryMetricReader) -> list:
    data = reader.get_metrics_data()
    return [(p.value, dict(p.attributes)) for rm in (data.resource_metrics if data else ()) for sm in rm.scope_metrics
            for m in sm.metrics if m.name == "gil.enabled" for p in m.data.data_points]

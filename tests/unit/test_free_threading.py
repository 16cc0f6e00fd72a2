"""``free_threading.UntilGilOn``, the backend of a free-threaded build running without its GIL,
on this build: nothing turns a GIL on here, so ``gil_on_for_good`` answers as CPython would
around an import that did. The real thing, on a free-threaded build, both backends:
tests/integration/test_free_threaded_gil.py."""

from __future__ import annotations

import importlib.util
import logging
from importlib.machinery import ExtensionFileLoader

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_gil import free_threading
from otel_gil.metrics import GilMetrics
from synthetic import make_ring
from test_spans import FakeRegistration, hooked, my_slot

EXTENSION = "_json"  # any extension module: its loader is where CPython turns the GIL on


def test_an_import_that_turns_the_gil_on_starts_the_backend(monkeypatch, caplog):
    ring = make_ring()
    registered, started = FakeRegistration(ring), []
    registered.stop = lambda: None
    original = ExtensionFileLoader.__dict__["create_module"]
    answers = iter([False, True])  # before the import, after it
    monkeypatch.setattr(free_threading, "gil_on_for_good", lambda: next(answers, True))
    monkeypatch.setattr(free_threading, "free_threaded", lambda: True)
    reader = InMemoryMetricReader()
    until = free_threading.UntilGilOn("auto", lambda: started.append(1) or registered)
    metrics = GilMetrics(until, MeterProvider([reader]).get_meter("test"), fast=False)
    gauge = []
    try:
        with hooked(until, False, metrics) as (tracer, _, exporter):
            with tracer.start_as_current_span("before"):
                pass
            gauge.append(_gauge(reader))
            with tracer.start_as_current_span("across"), caplog.at_level(logging.WARNING, "otel_gil"):
                spec = importlib.util.find_spec(EXTENSION)
                spec.loader.create_module(spec)
            my_slot(ring)
            with tracer.start_as_current_span("after"):
                pass
            gauge.append(_gauge(reader))
    finally:
        until.stop()
    assert ExtensionFileLoader.__dict__["create_module"] is original  # stop() took our wrapper out
    assert started == [1] and until.state is registered.state
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert spans["before"].attributes["gil.status"] == "gil_disabled"
    across = spans["across"]
    assert {k: v for k, v in across.attributes.items() if k.startswith("gil.")} == {"gil.status": "gil_turned_on"}
    [event] = across.events
    assert (event.name, dict(event.attributes)) == ("gil.enabled", {"gil.enabled_by": EXTENSION})
    assert across.start_time <= event.timestamp <= across.end_time
    assert "gil.status" not in spans["after"].attributes and spans["after"].attributes["gil.hold_ms"] == 0
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"otel-gil: importing {EXTENSION} ({spec.origin}) turned the GIL of this free-threaded "
                           "build on, at "), line
    assert gauge == [[], [(1, {"gil.enabled_by": EXTENSION})]]


def _gauge(reader: InMemoryMetricReader) -> list:
    data = reader.get_metrics_data()
    return [(p.value, dict(p.attributes)) for rm in (data.resource_metrics if data else ()) for sm in rm.scope_metrics
            for m in sm.metrics if m.name == "gil.enabled" for p in m.data.data_points]

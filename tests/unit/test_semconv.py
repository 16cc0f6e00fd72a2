"""otel_gil/semconv.py is the vocabulary: README.md's table of ``gil.status`` values is its
table, whatever error code a collector sends becomes one of its statuses, and every key a
span, its events, its wait spans and the metrics carry is one of its keys."""

from __future__ import annotations

import re
import time
from pathlib import Path

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.trace import SpanKind

from otel_gil import protocol
from otel_gil.metrics import GilMetrics
from otel_gil.semconv import (ALWAYS, ATTACH_FAILED, ATTRIBUTES, C_HOOK_KEYS, COLLECTOR_ERROR, EVENTS, EVERY_ONLY, INTERNAL,
                              STATUSES, WHEN_NONZERO)
from synthetic import log_hold, log_location, make_ring, record_wait
from test_spans import FakeRegistration, fast, hooked, my_slot, wait_spans_at  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parents[2]
COLLECTOR = ROOT / "collector" / "otel_gil_collector"


def readme_statuses() -> dict[str, str]:
    """README.md's table of ``gil.status`` values: value -> meaning."""
    table = (ROOT / "README.md").read_text().split("| `gil.status` | Meaning |\n|---|---|\n", 1)[1].split("\n\n", 1)[0]
    rows = [re.fullmatch(r"\| `([a-z_]+)` \| (.+) \|", line) for line in table.splitlines()]
    assert rows and all(rows), table
    return {row[1]: row[2] for row in rows}


def test_the_readme_says_which_attributes_a_span_carries_as_semconv_does():
    """The "On a span" column of README.md's attribute table: always, where not 0, with the switch."""
    table = (ROOT / "README.md").read_text().split("| Attribute | Type | On a span | Meaning |\n|---|---|---|---|\n", 1)[1]
    rows = [line.split(" | ") for line in table.split("\n\n", 1)[0].splitlines()]
    carried = {row[0].strip("|` "): row[2] for row in rows}
    assert {k for k, v in carried.items() if v == "always"} == set(ALWAYS)
    assert {k for k, v in carried.items() if v == "where not 0"} == set(WHEN_NONZERO)
    assert {k for k, v in carried.items() if v == "with `OTEL_GIL_ALL_ATTRIBUTES=1`"} == set(EVERY_ONLY)


def test_the_readme_lists_every_status_with_its_meaning():
    readme = readme_statuses()
    assert not readme.keys() - STATUSES.keys(), "in README.md, not in otel_gil/semconv.py"
    assert not STATUSES.keys() - readme.keys(), "in otel_gil/semconv.py, not in README.md"
    assert readme == STATUSES


def test_any_error_code_a_collector_sends_is_a_status():
    assert protocol.ERRORS <= STATUSES.keys()
    # The codes the collector sends are the protocol's (its source names no other).
    used = {name for path in COLLECTOR.glob("*.py") for name in re.findall(r"\bprotocol\.([A-Z_]+)\b", path.read_text())}
    assert {getattr(protocol, name) for name in used if isinstance(getattr(protocol, name), str)} <= protocol.ERRORS
    assert protocol.refusal({"ok": False, "error": ATTACH_FAILED, "message": "no uprobe"}) == (ATTACH_FAILED, "no uprobe")
    status, detail = protocol.refusal({"ok": False, "error": "quota_exceeded", "message": "come back later"})
    assert status == COLLECTOR_ERROR and detail == "the collector answered 'quota_exceeded': come back later"
    assert protocol.refusal({"ok": False})[0] == INTERNAL


def test_every_key_set_is_in_the_vocabulary(fast, wait_spans_at):
    """A server span with long waits, blamed with code locations (one gone), drawn as wait spans,
    counted by the metrics: every name and key they carry is semconv's."""
    wait_spans_at(2)
    reader = InMemoryMetricReader()
    ring = make_ring()
    reg = FakeRegistration(ring)
    metrics = GilMetrics(reg, MeterProvider([reader]).get_meter("test"), fast)
    with hooked(reg, fast, metrics) as (tracer, _, exporter):
        s = my_slot(ring)
        with tracer.start_as_current_span("GET /io", kind=SpanKind.SERVER, attributes={"http.route": "/io"}):
            t = time.monotonic_ns()
            log_hold(ring, 4242, t, t + 3_000_000)
            log_location(ring, 0, [("Stats.compute_stats", "/srv/stats.py", 42), ("run", "/srv/run.py", 3)])
            record_wait(s, t, t + 3_100_000, blocker=4242, held_ns=3_000_000, forced=True)
            log_hold(ring, 4343, t + 4_000_000, t + 5_000_000)  # its location never written: gone
            record_wait(s, t + 3_900_000, t + 5_100_000, blocker=4343, held_ns=1_000_000)
            time.sleep(0.01)
        with tracer.start_as_current_span("internal"):  # the common case: the C hooks' own keys
            pass
    finished = exporter.get_finished_spans()
    server, waits, internal = (next(x for x in finished if x.name == name) for name in ("GET /io", "gil.wait", "internal"))
    assert {e.name for e in server.events} | {waits.name} <= EVENTS.keys()
    keys = {k for x in finished for k in x.attributes}
    keys |= {k for e in server.events for k in e.attributes}
    points = [p for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics for m in sm.metrics
              for p in m.data.data_points]
    keys |= {k for p in points for k in p.attributes}
    assert keys <= ATTRIBUTES.keys(), keys - ATTRIBUTES.keys()
    assert {"gil.blocker.code.stacktrace", "gil.top_blocker.code.line.number", "le", "reason"} <= keys  # all were set
    assert set(internal.attributes) <= set(C_HOOK_KEYS) <= ATTRIBUTES.keys()

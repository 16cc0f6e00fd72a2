"""What a user sees in Jaeger's own UI (the session's Jaeger's: its release binary's, or the UI
build its Go build serves: scripts/jaeger.sh ui): the slowest /io trace of the Flask example,
opened in headless Chromium, its span expanded, shows the gil.* tags and a gil.wait log naming the hog, and
its timeline a gil.wait bar per long wait naming the hog's code. The screenshots stay in $OTEL_GIL_ARTIFACTS (default /tmp/otel-gil-artifacts)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from browser import BrowserError, Chromium
from helpers import drive, server_spans, stack

from otel_gil.semconv import ALWAYS

ARTIFACTS = Path(os.environ.get("OTEL_GIL_ARTIFACTS") or "/tmp/otel-gil-artifacts")
SERVICE = "flask-jaeger-ui"
HOG = "metrics-collector"

# Expand the span's detail, then its tags and its first log: clicks as a user makes them.
OPEN_SPAN = "[...document.querySelectorAll('a.span-name')].find(a => a.innerText.includes('GET /io'))"
HEADERS = "[...document.querySelectorAll('.AccordianKeyValues--header')]"
TAGS_HEADER = f"{HEADERS}.find(h => h.querySelector('[data-test=label]')?.innerText === 'Tags:')"
LOG_HEADER = f"{HEADERS}.find(h => h.closest('.AccordianLogs') && h.innerText.includes('gil.wait'))"
# Every key/value table the page shows now, as [[key, value], ...] per table.
TABLES = """[...document.querySelectorAll('.KeyValueTable')].map(t =>
    [...t.querySelectorAll('tr')].map(tr => [...tr.cells].map(td => td.innerText.trim())))"""


def require_ui() -> None:
    """Fails, naming what is missing, where the session's Jaeger serves no UI."""
    if not stack.jaeger_serves_ui():
        pytest.fail(f"the session's Jaeger serves no UI at {stack.JAEGER_QUERY}/, {stack.jaeger_ui()}")


def click(browser: Chromium, element: str) -> None:
    browser.wait_for(f"!!({element})")
    browser.evaluate(f"{element}.click()")


def open_trace(trace_id: str, shot: Path, ready: str, clicks: list[str], tables: int):
    """Open the trace's page, wait until ``ready`` (a JS expression) holds, click through
    ``clicks``, then screenshot: (``ready``'s value, the key/value tables shown, at least ``tables``)."""
    url = f"{stack.JAEGER_QUERY}/trace/{trace_id}"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        with Chromium() as browser:
            browser.navigate(url)
            value = browser.wait_for(ready)
            for element in clicks:
                click(browser, element)
            shown = browser.wait_for(f"{TABLES}.length >= {tables} && {TABLES}")
            browser.screenshot(shot)
    except BrowserError as exc:
        pytest.fail(f"{url}: {exc}")
    print(f"Jaeger UI screenshot: {shot}")
    return value, shown


def _first_blocker(span: dict):
    logs = sorted(span.get("logs", []), key=lambda log: log["timestamp"])
    fields = {f["key"]: f["value"] for f in logs[0]["fields"]} if logs else {}
    return fields.get("gil.blocker.thread.name")


def test_the_slow_io_span_shows_its_gil_tags_and_the_hog_in_jaeger_ui(collector_app):
    require_ui()
    svc = collector_app("flask", "dev", SERVICE, hog=True)
    drive(svc.address, "/io", 10, concurrency=1)
    spans = server_spans(SERVICE, "GET /io", 10)
    # The page shows a span's logs in time order; the first one is expanded. Take the slowest
    # span whose first gil.wait names the hog (a short one may name another thread, such as an
    # exporter's, which the API says as well).
    shown_first = [s for s in spans if _first_blocker(s) == HOG]
    assert shown_first, [_first_blocker(s) for s in spans]
    slowest = max(shown_first, key=lambda s: s["duration"])
    shot = ARTIFACTS / f"jaeger-ui-{slowest['traceID']}.png"
    _, tables = open_trace(slowest["traceID"], shot, "true", [OPEN_SPAN, TAGS_HEADER, LOG_HEADER], 2)

    tags = dict(row for row in tables[0] if len(row) == 2)
    for key in ALWAYS:  # the counters are there only where not 0
        assert key in tags, (key, tags, shot)
    assert float(tags["gil.wait_ms"]) == pytest.approx(slowest["tags"]["gil.wait_ms"]), (tags, shot)
    assert float(tags["gil.wait_ratio"]) > 0.3, (tags, shot)  # the page shows what the hog did to /io
    log = dict(row for row in tables[1] if len(row) == 2)
    assert log.get("event") == "gil.wait" and log.get("gil.blocker.thread.name") == HOG, (log, shot)
    assert float(log["gil.wait_ms"]) > 0, (log, shot)


WAIT_ROWS = "[...document.querySelectorAll('a.span-name')].filter(a => a.innerText.includes('gil.wait'))"


def test_the_waits_are_bars_in_the_trace_timeline_naming_the_hogs_code(collector_app):
    """The slowest /io trace's timeline shows a gil.wait child bar per long wait; opening one
    shows the hog's thread and function (examples/workload.py's compute_stats or its loop)."""
    require_ui()
    svc = collector_app("flask", "dev", SERVICE + "-bars", hog=True)
    drive(svc.address, "/io", 10, concurrency=1)
    spans = server_spans(SERVICE + "-bars", "GET /io", 10)
    slowest = max(spans, key=lambda s: s["duration"])
    bars = [s for s in stack.jaeger_spans(SERVICE + "-bars")
            if s["traceID"] == slowest["traceID"] and s["operationName"] == "gil.wait"]
    long = [log for log in slowest.get("logs", []) if {f["key"]: f["value"] for f in log["fields"]}["gil.wait_ms"]
            >= 5.0]  # the default threshold: the switch interval
    assert bars and len(bars) == len(long), (len(bars), len(long))
    bars.sort(key=lambda s: s["startTime"])  # the timeline's order of sibling rows
    hogs = [i for i, s in enumerate(bars) if s["tags"].get("gil.blocker.thread.name") == HOG]
    assert hogs, [s["tags"] for s in bars]
    opened = max(hogs, key=lambda i: bars[i]["duration"])  # another thread (an exporter's) may block a wait too
    shot = ARTIFACTS / f"jaeger-ui-gil-wait-{slowest['traceID']}.png"
    shown, tables = open_trace(slowest["traceID"], shot, f"{WAIT_ROWS}.length >= {len(bars)} && {WAIT_ROWS}.length",
                               [f"{WAIT_ROWS}[{opened}]", TAGS_HEADER], 1)
    assert shown == len(bars), (shown, len(bars), shot)
    tags = dict(row for row in tables[0] if len(row) == 2)
    assert tags.get("gil.blocker.thread.name") == HOG, (tags, shot)
    assert float(tags["gil.wait_ms"]) == pytest.approx(bars[opened]["tags"]["gil.wait_ms"]), (tags, shot)
    assert tags.get("gil.blocker.code.function.name") in ("compute_stats", "_metrics_collector"), (tags, shot)
    assert tags.get("gil.blocker.code.file.path", "").endswith("examples/workload.py"), (tags, shot)


def test_a_fastapi_trace_shows_its_own_hold_beside_the_loops_time_on_the_others(collector_app):
    """The async example with 20 requests in flight on uvicorn's loop: the slowest /fanout
    trace in Jaeger's UI, its server span's tags open: its own code's hold, the loop's hold for
    the other requests meanwhile, and its wait, as the API has them; its parts (gather
    children) are spans with their own holds."""
    require_ui()
    service = "fastapi-jaeger-ui"
    svc = collector_app("fastapi", "uvicorn", service, hog=True)
    drive(svc.address, "/fanout,/io,/cpu", 60, concurrency=20)
    spans = server_spans(service, "GET /fanout", 20)
    slowest = max(spans, key=lambda s: s["duration"])
    parts = [s for s in stack.jaeger_spans(service) if s["traceID"] == slowest["traceID"] and
             s["operationName"].startswith("part ")]
    assert len(parts) == 3 and all("gil.hold_ms" in p["tags"] for p in parts), parts
    shot = ARTIFACTS / f"jaeger-ui-async-{slowest['traceID']}.png"
    open_fanout = OPEN_SPAN.replace("GET /io", "GET /fanout")
    _, tables = open_trace(slowest["traceID"], shot, "true", [open_fanout, TAGS_HEADER], 1)
    tags = dict(row for row in tables[0] if len(row) == 2)
    for key in ("gil.hold_ms", "gil.others_hold_ms", "gil.wait_ms"):
        assert float(tags[key]) == pytest.approx(slowest["tags"][key]), (key, tags, shot)
    assert float(tags["gil.others_hold_ms"]) > float(tags["gil.hold_ms"]), (tags, shot)  # 19 others on its loop

"""A blocker that ended before the span that waited for it is still named: a thread named
``short-hog`` holds the GIL 150 ms through a PyDLL call and ends; the span that waited for it
(``waiter``) ends after, and its top blocker, its gil.wait event and its gil.wait child span name
``short-hog``, with the hold the hog measured (the waiter waits from the hand-off on: the whole
hold falls in its wait, to 0.1-0.25 ms measured at a load average of 17). With both writers; alone, and beside the threading instrumentation under
opentelemetry-instrument in either order (which also must keep its wrapper of Thread.start when
otel_gil is uninstrumented); and never by the name of a later thread its tid went to."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import SCENARIOS, Runner, run_scenario, span, within

BURST_MS = 150
INSTRUMENT = Path(sys.executable).parent / "opentelemetry-instrument"
THEIRS = "ThreadingInstrumentor.__wrap_threading_start"
# first instrumented -> what opentelemetry-instrument leaves out, to be instrumented by hand after it
ORDERS = {"gil": "threading", "threading": "gil"}


def _under_opentelemetry_instrument(socket: str, backend: str, first: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(SCENARIOS.parents[2]), "OTEL_GIL_BACKEND": backend,
           "OTEL_GIL_SOCKET": socket, "OTEL_GIL_REGISTER_TIMEOUT_S": "20",
           "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": ORDERS[first],
           "OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none"}
    cmd = [str(INSTRUMENT), sys.executable, str(SCENARIOS), "short", socket, "--burst-ms", str(BURST_MS), "--auto"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, f"{cmd} failed:\n{done.stderr}"
    return json.loads(done.stdout)


def _check_named(report: dict) -> None:
    truth, waiter = report["truth"], span(report, "waiter")
    attrs = waiter["attributes"]
    assert attrs["gil.top_blocker.thread.native_id"] == truth["tid"], attrs
    assert attrs.get("gil.top_blocker.thread.name") == "short-hog", attrs
    assert within(attrs["gil.top_blocker.hold_ms"], truth["burst_ns"] / 1e6), (attrs, truth)
    events = [e["attributes"] for e in waiter["events"] if e["name"] == "gil.wait"]
    by_hog = [e for e in events if e["gil.blocker.thread.native_id"] == truth["tid"]]
    assert by_hog and all(e.get("gil.blocker.thread.name") == "short-hog" for e in by_hog), events
    children = [s["attributes"] for s in report["spans"] if s["name"] == "gil.wait" and s["parent_id"] == waiter["span_id"]]
    by_hog = [c for c in children if c["gil.blocker.thread.native_id"] == truth["tid"]]
    assert by_hog and all(c.get("gil.blocker.thread.name") == "short-hog" for c in by_hog), children


def test_an_ended_blocker_is_named(collector, backend):
    _check_named(run_scenario("short", collector.address, "--burst-ms", str(BURST_MS), backend=backend))


def test_a_reused_tid_is_named_for_the_thread_that_had_it(collector, backend):
    """The hog's tid goes to a thread named ``later`` (alive when the span ends) before the span
    ends: the span names the hog, never ``later``. In a pid namespace of its own, where the
    workload sets the next tid (ns_last_pid) with nothing else taking it."""
    runner = Runner(sys.executable, prefix=("unshare", "--pid", "--fork", "--mount-proc"))
    report = run_scenario("short", collector.address, "--burst-ms", str(BURST_MS), "--reuse-tid",
                          runner=runner, backend=backend)
    assert report["truth"]["later_tid"] == report["truth"]["tid"], report["truth"]
    _check_named(report)


@pytest.mark.parametrize("first", ORDERS)
def test_an_ended_blocker_is_named_beside_the_threading_instrumentation(collector, backend, first):
    report = _under_opentelemetry_instrument(collector.address, backend, first)
    assert report["backend"] == backend
    ours = "_log_start"
    assert report["truth"]["wrappers"] == ([THEIRS, ours] if first == "gil" else [ours, THEIRS])
    _check_named(report)
    assert report["truth"]["wrappers_after_uninstrument"] == [THEIRS]

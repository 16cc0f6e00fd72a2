"""Parked time on spans of a free-threaded build (3.13t) running without its GIL, in-process,
against ground truths measured by the workload (tests/workloads/parks.py): a list's critical
section, a stop-the-world, the app's locks; and with the GIL on, GIL figures and no parked time.
Tolerance: 5 % or 0.5 ms, whichever is larger."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from helpers import ROOT, Runner, span, within
from otel_gil import ring

WORKLOAD = ROOT / "tests" / "workloads" / "parks.py"
HOLD_MS = 200
MS = 1e6


def run(runner: Runner, scenario: str, hold_ms: int = HOLD_MS, **env: str) -> dict:
    done = subprocess.run([runner.python, str(WORKLOAD), scenario, str(hold_ms)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **runner.env, "PYTHONPATH": str(ROOT), **env})
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    report["stderr"] = done.stderr
    return report


def parks_of(of: dict, kind: str) -> list[dict]:
    return [e["attributes"] for e in of["events"] if e["name"] == "cpython.park" and e["attributes"]["cpython.park.kind"] == kind]


def test_a_critical_section_on_a_list(free_threaded):
    report = run(free_threaded, "critical_section")
    assert (report["hooked"], report["gil"]) == (True, False), report["stderr"]
    attrs, truth_ms = span(report, "victim")["attributes"], report["truth"]["waited_ns"] / MS
    assert truth_ms >= HOLD_MS * 0.9, report["truth"]
    assert within(attrs["cpython.parked.critical_section_ms"], truth_ms), (attrs, truth_ms)
    assert report["parked_s"]["critical_section"] * 1e3 >= attrs["cpython.parked.critical_section_ms"] - 1e-6, report["parked_s"]
    assert attrs["cpython.parked.critical_section.top_type"] == "list", attrs
    assert attrs["cpython.parked.app_lock_ms"] + attrs["cpython.parked.stop_the_world_ms"] < 0.5, attrs
    (park,) = parks_of(span(report, "victim"), "critical_section")
    assert park["cpython.park.object.type"] == "list" and within(park["cpython.park.ms"], truth_ms), park


def test_a_stop_the_world_suspends_the_other_threads(free_threaded):
    """The victim's longest pause between two steps of its loop holds its stop-the-world park,
    which ends with it (within the tolerance); and is as long, unless the kernel preempted the
    victim in that pause (then it may have been off the CPU before it parked)."""
    report = run(free_threaded, "stop_the_world")
    assert (report["hooked"], report["gil"]) == (True, False), report["stderr"]
    truth, victim, offset = report["truth"], span(report, "victim"), report["wall_minus_mono"]
    assert truth["pause_start_ns"] < truth["collect_end_ns"] and truth["pause_end_ns"] > truth["collect_start_ns"], truth
    pause_ms = (truth["pause_end_ns"] - truth["pause_start_ns"]) / MS
    (event,) = [e for e in victim["events"] if e["attributes"] == max(parks_of(victim, "stop_the_world"),
                                                                    key=lambda p: p["cpython.park.ms"])]
    park_ms, start_ns = event["attributes"]["cpython.park.ms"], event["time"] - offset
    assert -0.5 * MS <= truth["pause_end_ns"] - (start_ns + park_ms * MS) <= max(0.05 * pause_ms, 0.5) * MS, (event, truth)
    assert start_ns >= truth["pause_start_ns"] - 0.5 * MS, (event, truth)
    if not truth["pause_preempted"]:
        assert within(park_ms, pause_ms), (event, truth)
    assert victim["attributes"]["cpython.parked.stop_the_world_ms"] >= park_ms, victim["attributes"]
    assert report["parked_s"]["stop_the_world"] * 1e3 >= park_ms - 1e-6, report["parked_s"]


@pytest.mark.parametrize("scenario", ["app_lock", "rlock"])
def test_a_lock_held_by_another_thread_is_the_apps_lock(free_threaded, scenario):
    report = run(free_threaded, scenario)
    assert (report["hooked"], report["gil"]) == (True, False), report["stderr"]
    attrs, truth_ms = span(report, "victim")["attributes"], report["truth"]["waited_ns"] / MS
    assert truth_ms >= HOLD_MS * 0.9, report["truth"]
    assert within(attrs["cpython.parked.app_lock_ms"], truth_ms), (attrs, truth_ms)
    assert report["parked_s"]["app_lock"] * 1e3 >= attrs["cpython.parked.app_lock_ms"] - 1e-6, report["parked_s"]
    assert attrs["cpython.parked.critical_section_ms"] < 0.5, attrs


def test_a_forked_child_times_its_own_parks(free_threaded):
    """The child of a process whose parks were hooked starts its slots afresh and times its own."""
    report = run(free_threaded, "fork")
    assert report["hooked"], report["stderr"]
    child, parent = report["truth"], span(report, "victim")["attributes"]
    assert parent["cpython.parked.app_lock_ms"] >= HOLD_MS * 0.9, parent
    attrs, truth_ms = child["attributes"], child["truth"]["waited_ns"] / MS
    assert within(attrs["cpython.parked.app_lock_ms"], truth_ms) and attrs["cpython.parks"] == 1, (attrs, truth_ms)


def own_parks_on_a_shared_thread(report: dict, blocked: dict, victim: dict) -> None:
    """The request that waited carries its wait as app-lock time (its park as an event); the one
    in flight on the same thread meanwhile carries none of it."""
    assert (report["hooked"], report["contexts"], report["gil"]) == (True, True, False), report["stderr"]
    truth_ms = report["truth"]["waited_ns"] / MS
    assert truth_ms >= HOLD_MS * 0.9, report["truth"]
    assert within(blocked["cpython.parked.app_lock_ms"], truth_ms), (blocked, truth_ms)
    assert blocked["cpython.parked.critical_section_ms"] < 0.5, blocked
    assert victim["cpython.parked_ms"] < 0.5 and victim["cpython.parks"] <= 1, victim
    assert report["parked_s"]["app_lock"] * 1e3 >= blocked["cpython.parked.app_lock_ms"] - 1e-6, report["parked_s"]
    assert report["context_run"] == "method_descriptor", report["context_run"]  # restored at uninstrument()


@pytest.mark.parametrize("scenario", ["loop", "to_thread"])
def test_on_an_asyncio_loop_each_request_carries_its_own_parks(free_threaded, scenario):
    """Two requests' tasks on one loop: the one whose code waits 200 ms for a lock (blocking the
    loop's thread, or in asyncio.to_thread's worker) carries the park; the other, in flight
    throughout, none of it."""
    report = run(free_threaded, scenario)
    own_parks_on_a_shared_thread(report, span(report, "blocked")["attributes"], span(report, "victim")["attributes"])
    (blocked,) = [s for s in report["spans"] if s["name"] == "blocked"]
    (park,) = parks_of(blocked, "app_lock")
    assert within(park["cpython.park.ms"], report["truth"]["waited_ns"] / MS), park


def test_on_uvicorn_each_request_carries_its_own_parks(free_threaded):
    """A real uvicorn server (asyncio loop, h11), OpenTelemetry's ASGI middleware making the server
    spans: GET /blocked waits 200 ms for a lock while GET /victim is in flight on the same loop."""
    report = run(free_threaded, "uvicorn")
    blocked, victim = (span(report, f"GET /{name}", **{"http.target": f"/{name}"}) for name in ("blocked", "victim"))
    own_parks_on_a_shared_thread(report, blocked["attributes"], victim["attributes"])


def test_between_greenlets_each_carries_its_own_parks(free_threaded):
    """Two greenlets of one thread (PYTHON_GIL=0: greenlet 3.2's module does not declare
    Py_mod_gil, so importing it would turn the GIL on): the one that waits carries the park."""
    report = run(free_threaded, "greenlets", PYTHON_GIL="0")
    own_parks_on_a_shared_thread(report, span(report, "blocked")["attributes"], span(report, "victim")["attributes"])


def test_with_the_gil_on_gil_figures_and_no_parked_time(free_threaded):
    """PYTHON_GIL=1: the park hooks are not installed; the lock wait is no GIL wait either
    (the holder sleeps with the GIL released), so nothing is counted twice."""
    report = run(free_threaded, "app_lock", PYTHON_GIL="1")
    assert (report["hooked"], report["contexts"], report["gil"]) == (False, False, True), report["stderr"]
    attrs = span(report, "victim")["attributes"]
    assert not [k for k in attrs if k.startswith("cpython.park")] and not report["parked_s"], (attrs, report)
    assert "gil.wait_ms" in attrs and "gil.status" not in attrs, attrs
    assert attrs["gil.wait_ms"] < 0.1 * report["truth"]["waited_ns"] / MS, attrs


def test_without_the_c_charge_points_a_loop_span_carries_no_parks(free_threaded):
    """Without otel_gil._parkcontexts (an sdist built without a compiler) a park on a loop's thread
    cannot be told whose: no span there carries parked time (the thread did park)."""
    report = run(free_threaded, "loop", PARKS_WITHOUT_CHARGE_POINTS="1")
    assert (report["hooked"], report["contexts"]) == (True, False), report["stderr"]
    assert report["parked_s"]["app_lock"] * 1e3 >= HOLD_MS * 0.5, report["parked_s"]
    for name in ("victim", "blocked"):
        attrs = span(report, name)["attributes"]
        assert not [k for k in attrs if k.startswith("cpython.park")], attrs
    assert "_parkcontexts was not built: spans on event loops and greenlets carry no parked time" in report["stderr"]


def test_a_span_in_flight_across_a_reinstrument_carries_no_parks(free_threaded):
    """Its charges stopped while otel-gil was uninstrumented: it carries none rather than a part;
    a span started after carries its own."""
    report = run(free_threaded, "reinstrumented")
    assert (report["hooked"], report["contexts"]) == (True, True), report["stderr"]
    attrs = span(report, "victim")["attributes"]
    assert report["truth"]["victim_waited_ns"] / MS >= HOLD_MS * 0.5, report["truth"]  # it did park, in the span
    assert not [k for k in attrs if k.startswith("cpython.park")], attrs
    after, truth_ms = span(report, "after")["attributes"], report["truth"]["waited_ns"] / MS
    assert truth_ms >= HOLD_MS * 0.9 and within(after["cpython.parked.app_lock_ms"], truth_ms), (after, truth_ms)


def test_with_the_gil_on_a_loop_is_as_before(free_threaded):
    """PYTHON_GIL=1 on an asyncio loop: no charge point of parked time (Context.run stays the
    builtin's), no parked time, and the loop's spans say shared_thread (no _fastspan here), as before."""
    report = run(free_threaded, "loop", PYTHON_GIL="1")
    assert (report["hooked"], report["contexts"], report["gil"]) == (False, False, True), report["stderr"]
    assert report["context_run_instrumented"] == "method_descriptor", report["context_run_instrumented"]
    for name in ("victim", "blocked"):
        attrs = span(report, name)["attributes"]
        assert not [k for k in attrs if k.startswith("cpython.park")], attrs
        assert attrs["gil.status"] == "shared_thread", attrs


def test_soak_every_span_parked_no_longer_than_it_lasted(free_threaded):
    """8 threads and 20 tasks on a loop, 2 s of spans contending on a list, a dict, a lock and the
    GC: per span, each kind >= 0 and their sum <= its duration; some spans parked, on more than one
    kind; the loop's spans carry their own figures, some of them parks."""
    report = run(free_threaded, "soak", 2000)
    assert (report["hooked"], report["gil"]) == (True, False), report["stderr"]
    spans = [s for s in report["spans"] if s["name"] == "request"]  # not the cpython.park child spans
    assert len(spans) > 100, len(spans)
    kinds = set()
    for request in spans:
        attrs = request["attributes"]
        parked = [attrs[f"cpython.parked.{kind}_ms"] for kind in ("stop_the_world", "critical_section", "app_lock",
                                                                      "internal", "other")]
        assert min(parked) >= 0 and abs(sum(parked) - attrs["cpython.parked_ms"]) < 1e-6, attrs
        assert attrs["cpython.parked_ms"] * MS <= request["duration_ns"], request
        kinds |= {i for i, p in enumerate(parked) if p}
    assert len(kinds) >= 2, kinds
    on_loop = [s["attributes"] for s in spans if s["attributes"].get("loop")]
    assert any(a["cpython.parks"] for a in on_loop), len(on_loop)  # (how many: 10 to 300, as the load goes)


def test_the_collector_tells_each_address_apart_as_the_in_process_writer(free_threaded, tmp_path):
    """The twins that say what a park's address is (park_kind.h's park_kind(), the in-process
    writer's; the collector's parkkinds.py) on the same addresses of one process, each kind
    among them: they agree."""
    done = subprocess.run([free_threaded.python, str(ROOT / "tests" / "workloads" / "park_kinds.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, **free_threaded.env, "PYTHON_GIL": "0",
                               "PYTHONPATH": f"{ROOT}:{ROOT / 'collector'}"})
    assert done.returncode == 0, done.stderr
    both = json.loads(done.stdout)
    assert {label: c for label, (c, _) in both.items()} == {label: py for label, (_, py) in both.items()}, both
    assert {c[0] for c, _ in both.values()} == set(range(ring.PARK_KINDS)), both  # each kind was asked
    assert both["Lock's lock mutex"][0] == [ring.PARK_APP_LOCK, ""], both
    assert both["dict's ob_mutex"][0] == [ring.PARK_OBJECT, "dict"], both

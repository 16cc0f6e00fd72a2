"""Blame by time held and forced switches, against workloads whose culprit is known,
with both writers (the session's ``backend`` fixture)."""

import statistics

import pytest

from helpers import HOG_BURSTS as BURSTS, run_scenario, span, within



def _waits(report: dict, name: str) -> list[dict]:
    return [e["attributes"] for s in report["spans"] if s["name"] == name for e in s["events"] if e["name"] == "gil.wait"]


def _parts_ms(w: dict) -> float:
    """A wait's breakdown: the named holders, other logged ones, unlogged holds, hand-off."""
    return (sum(w.get("gil.blockers.hold_ms", ())) + w.get("gil.blockers.others_ms", 0)
            + w["gil.blockers.unrecorded_ms"] + w["gil.handoff_ms"])


@pytest.fixture(scope="module")
def requests_report(collector, backend):
    return run_scenario("requests", collector.address, "--io-threads", "4", "--requests", "20", backend=backend)


def test_the_cpu_bound_thread_is_the_top_blocker_among_request_threads(requests_report):
    """The issue's workload: a pure-Python CPU-bound thread among 4 request threads. The
    last releaser was the hog in 38 % of long waits; the longest holder is it in >= 90 %."""
    hog_span = span(requests_report, "hog")
    hog = hog_span["attributes"]["thread.id"]
    waits = _waits(requests_report, "request")
    assert len(waits) >= 100, len(waits)  # 4 x 20 requests x 10 steps, most behind the hog
    # A blocker that exited before the waiter's span ended (a request thread done with its
    # requests) is still named, with its thread.id (test_short_blockers).
    by_hog = [w for w in waits if w.get("gil.blocker.thread.id") == hog]
    assert len(by_hog) >= 0.9 * len(waits), [
        w.get("gil.blocker.thread.name", w["gil.blocker.thread.native_id"]) for w in waits if w not in by_hog
    ]
    for w in by_hog:  # the hog runs inside its span: the events say which
        assert w["gil.blocker.thread.name"] == "cpu-hog", w
        assert (w["gil.blocker.span.name"], w["gil.blocker.span_id"]) == ("hog", hog_span["span_id"]), w
    requests = [s for s in requests_report["spans"] if s["name"] == "request" and s["events"]]
    tops = [s["attributes"].get("gil.top_blocker.thread.name") for s in requests]
    assert tops.count("cpu-hog") >= 0.9 * len(tops), tops


def test_each_wait_breaks_down_to_its_length(requests_report):
    """Held by named threads + by others + in unlogged holds + hand-off = the wait, within 5 %:
    the hold log (per holder) never claims more than the writer's held total of the wait."""
    for w in _waits(requests_report, "request"):
        assert within(_parts_ms(w), w["gil.wait_ms"], rel=0.05, abs_ms=0.005), w
        assert w["gil.blocker.hold_ms"] <= w["gil.wait_ms"] + 0.005, w
        assert list(w["gil.blockers.hold_ms"]) == sorted(w["gil.blockers.hold_ms"], reverse=True), w


def test_the_pydll_hog_held_the_gil_for_its_bursts(hog_report):
    """Each victim wait is blamed on the hog for the burst it waited out (PyDLL truth): each
    within 25 % (a busy VM delays the victim's wake-up by milliseconds), their median 5 %."""
    waits = [w for w in _waits(hog_report, "victim") if w.get("gil.blocker.thread.name") == "gil-hog"]
    assert len(waits) == BURSTS, waits
    bursts_ms = [ns / 1e6 for ns in hog_report["truth"]["bursts_ns"]]
    for w, burst in zip(waits, bursts_ms):
        assert within(w["gil.blocker.hold_ms"], burst, rel=0.25), (w, burst)
        assert within(_parts_ms(w), w["gil.wait_ms"], rel=0.05, abs_ms=0.005), w
    assert within(statistics.median(w["gil.blocker.hold_ms"] for w in waits), statistics.median(bursts_ms))
    victim = span(hog_report, "victim")["attributes"]
    assert victim["gil.top_blocker.thread.name"] == "gil-hog"
    assert within(victim["gil.top_blocker.hold_ms"], sum(bursts_ms), rel=0.1)


def test_forced_switches_count_as_waiting(collector, backend):
    """Two CPU-bound threads: each always either holds the GIL or wants it back, so its
    hold + wait is its span's length, and it waits while the other holds."""
    report = run_scenario("switches", collector.address, "--seconds", "1", backend=backend)
    a, b = span(report, "spinner-a"), span(report, "spinner-b")
    for me, other in ((a, b), (b, a)):
        attrs, duration_ms = me["attributes"], me["duration_ns"] / 1e6
        assert within(attrs["gil.wait_ms"] + attrs["gil.hold_ms"], duration_ms), attrs
        assert within(attrs["gil.wait_ms"], other["attributes"]["gil.hold_ms"]), (attrs, other["attributes"])
        assert attrs["gil.convoy_waits"] >= 0.8 * attrs["gil.acquisitions"], attrs  # each wait ~ a switch interval
        waits = [e["attributes"] for e in me["events"]]
        assert waits and all(w.get("gil.wait.forced_switch") for w in waits), waits
        # by kernel tid (names: test_short_blockers)
        tid = report["truth"]["tids"][other["name"]]
        assert {w["gil.blocker.thread.native_id"] for w in waits} == {tid}, waits

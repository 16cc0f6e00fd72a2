"""GIL figures on spans against ground truth, measured by each backend (the real collector,
and the in-process hooks).

The hog holds the GIL through ctypes.PyDLL (which never releases it) for known
bursts; the victim is woken by the hog right before each burst, so it waits for
the whole burst. Tolerance: 5 % or 0.5 ms, whichever is larger.
"""

import statistics

import pytest

from helpers import HOG_BURST_MS as BURST_MS, HOG_BURSTS as BURSTS, span, within


@pytest.fixture
def report(hog_report):
    return hog_report


def test_victim_wait_matches_the_bursts(report):
    victim = span(report, "victim")["attributes"]
    truth_ms = report["truth"]["victim_wait_ns"] / 1e6
    assert within(victim["gil.wait_ms"], truth_ms), (victim, truth_ms)
    assert victim["gil.convoy_waits"] == BURSTS


def test_victim_holds_little(report):
    victim = span(report, "victim")
    assert victim["attributes"]["gil.hold_ms"] < 0.02 * BURSTS * BURST_MS, victim
    assert victim["attributes"]["gil.acquisitions"] >= BURSTS


def test_ratios_are_figures_over_span_duration(report):
    victim = span(report, "victim")
    attrs = victim["attributes"]
    duration_ms = victim["duration_ns"] / 1e6
    assert within(attrs["gil.wait_ratio"], attrs["gil.wait_ms"] / duration_ms, rel=0.02, abs_ms=0.005)
    assert 0.5 < attrs["gil.wait_ratio"] <= 1.0


def test_hog_holds_for_its_bursts(report):
    hog = span(report, "hog")["attributes"]
    truth_ms = sum(report["truth"]["bursts_ns"]) / 1e6
    assert within(hog["gil.hold_ms"], truth_ms), (hog, truth_ms)
    assert hog["gil.wait_ms"] < 0.05 * truth_ms
    assert hog["thread.name"] == "gil-hog"


def test_long_waits_name_the_blocker(report):
    victim = span(report, "victim")
    hog_tid = span(report, "hog")["attributes"]["thread.id"]
    assert {e["name"] for e in victim["events"]} == {"gil.wait"}
    # Before the first burst the victim may wait a millisecond on the main thread starting
    # the threads (a busy VM makes it so): that wait names MainThread, every other the hog.
    assert {e["attributes"]["gil.blocker.thread.name"] for e in victim["events"]} <= {"gil-hog", "MainThread"}
    events = [e for e in victim["events"] if e["attributes"]["gil.blocker.thread.id"] == hog_tid]
    assert len(events) == BURSTS, victim["events"]
    for event in events:
        attrs = event["attributes"]
        assert attrs["gil.blocker.thread.name"] == "gil-hog"
        # One event per burst, each about a burst long: a busy VM delays the victim's wake-up
        # (its wait starts late) or its turn after the hog (ends late) by up to ~11 ms (seen in
        # CI), so each event is held to 25 %, their median to the usual 5 %.
        assert within(attrs["gil.wait_ms"], BURST_MS, rel=0.25), attrs
    assert within(statistics.median(e["attributes"]["gil.wait_ms"] for e in events), BURST_MS, rel=0.05)
    assert sum(e["attributes"]["gil.wait_ms"] for e in victim["events"]) <= victim["attributes"]["gil.wait_ms"] + 0.01


def test_thread_attributes_follow_semantic_conventions(report):
    names = {s["span_id"]: s["name"] for s in report["spans"]}
    for s in report["spans"]:
        assert isinstance(s["attributes"]["thread.id"], int)
        named_for = names[s["parent_id"]] if s["name"] == "gil.wait" else s["name"]  # a wait: its parent's thread
        assert s["attributes"]["thread.name"] == named_for.replace("hog", "gil-hog")
        assert "gil.status" not in s["attributes"]

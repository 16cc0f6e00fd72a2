"""The same ground truth on every CPython build we claim (README's table): pyenv
3.9-3.13 with symbols, and Debian's python3.11, stripped, LTO+PGO, statically
linked, where drop_gil is inlined into os_stat, _Py_read, ... and take_gil is
found through PyEval_AcquireLock's call."""

import pytest

from helpers import interpreters, run_scenario, span, within

RUNNERS = interpreters()


@pytest.mark.parametrize("name", RUNNERS)
def test_hog_ground_truth(collector, backend, name):
    report = run_scenario("hog", collector.address, "--bursts", "5", "--burst-ms", "100", runner=RUNNERS[name],
                          backend=backend)
    victim, hog = span(report, "victim")["attributes"], span(report, "hog")["attributes"]
    assert "gil.status" not in victim, report["stderr"]
    assert within(victim["gil.wait_ms"], report["truth"]["victim_wait_ns"] / 1e6), victim
    assert within(hog["gil.hold_ms"], sum(report["truth"]["bursts_ns"]) / 1e6), hog
    blockers = [e["attributes"]["gil.blocker.thread.name"] for e in span(report, "victim")["events"]]
    assert blockers.count("gil-hog") == 5 and set(blockers) <= {"gil-hog", "MainThread"}, blockers  # see test_ground_truth


@pytest.mark.parametrize("name", RUNNERS)
def test_inlined_releases_are_counted(collector, backend, name):
    """os.stat/os.read release the GIL through whatever copy of drop_gil the build has."""
    report = run_scenario("syscalls", collector.address, "--iterations", "500", runner=RUNNERS[name], backend=backend)
    attrs = span(report, "syscalls")["attributes"]
    truth = report["truth"]
    assert truth["acquisitions"] <= attrs["gil.acquisitions"] <= truth["acquisitions"] + 2, attrs
    held_ms = truth["usleep_hold_ns"] / 1e6
    assert held_ms * 0.995 <= attrs["gil.hold_ms"] <= held_ms * 1.05 + 0.5, (attrs, held_ms)
    assert attrs["gil.wait_ms"] < 0.5, attrs

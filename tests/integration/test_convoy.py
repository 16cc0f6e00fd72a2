"""The convoy effect (Beazley, CPython issue 7946) made visible.

An I/O thread releases the GIL on each short I/O call and must then wait for a
CPU-bound thread to be forced off it: a switch interval per call.
"""

import statistics

from helpers import run_scenario, span


def test_io_thread_waits_the_switch_interval(collector, backend):
    report = run_scenario("convoy", collector.address, "--reads", "100", backend=backend)
    io = span(report, "io")
    attrs = io["attributes"]
    interval_ms = report["truth"]["switch_interval_ms"]
    reads = report["truth"]["reads"]
    assert attrs["gil.convoy_waits"] >= 0.8 * reads, attrs  # a call may end before the spinner woke
    assert attrs["gil.acquisitions"] >= reads, attrs
    per_wait = attrs["gil.wait_ms"] / attrs["gil.convoy_waits"]
    assert interval_ms <= per_wait <= interval_ms * 1.3, attrs
    waits = [e["attributes"]["gil.wait_ms"] for e in io["events"]]
    assert waits, io
    assert interval_ms <= statistics.median(waits) <= interval_ms * 1.3, waits
    blockers = [e["attributes"]["gil.blocker.thread.name"] for e in io["events"]]
    assert blockers.count("cpu-bound") >= 0.8 * len(blockers), blockers  # the main thread may start it
    assert attrs["gil.wait_ratio"] > 0.5, attrs

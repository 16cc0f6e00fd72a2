"""otel-gil's own structures stay within their bounds over an app's life (bench/memory_soak.py's
workload, shorter and with smaller bounds, so that each is reached): thread churn, requests,
streaming spans open throughout, metrics read."""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict

from helpers import ROOT
from otel_gil import threads, wait_spans

sys.path.insert(0, str(ROOT / "bench"))
import memory_soak  # noqa: E402


def test_structures_stay_within_their_bounds(monkeypatch):
    monkeypatch.setattr(threads, "MEMORY", 64)
    monkeypatch.setattr(wait_spans, "MAX_DRAWN", 32)
    monkeypatch.setattr(wait_spans, "_drawn", OrderedDict())  # (not what earlier tests drew)
    alive = threading.active_count() - 1  # threads earlier tests of this process left running: owners too
    soak = memory_soak.Soak(requests=40_000, per_thread=50, samples=20)
    results = soak.run()
    assert results[-1]["threads_started"] >= 8 * threads.MEMORY  # bounds reached, many times over
    assert max(r["handed_max"] for r in results) == wait_spans.MAX_HANDED, results
    for r in results:
        assert r["owners"] <= threads.MEMORY + memory_soak.WORKERS + 2 + 1 + alive, r  # (+ main, streams; one freed since)
        assert r["drawn"] <= wait_spans.MAX_DRAWN and r["handed_max"] <= wait_spans.MAX_HANDED, r
        assert r["starts"] <= threads._MAX_STARTS, r
    assert results[-1]["wait_spans"] > 0  # the streams drew what they kept

"""Pre-fork servers: every gunicorn worker gets its own figures after fork (re-registered
with the collector on its first span, or its in-process ring started afresh), sync and gthread workers,
with and without --preload; the slowest requests name the GIL hog as their top blocker. With the C
span hooks, and on gthread workers (a thread per request) with the Python ones alone too."""

import os
import time

import pytest

from helpers import drive, python_hooks_in, server_spans


def _workers(master: int) -> dict[int, set[int]]:
    """Worker pid -> its thread ids, read from /proc while they run."""
    with open(f"/proc/{master}/task/{master}/children") as f:
        pids = [int(p) for p in f.read().split()]
    return {pid: {int(t) for t in os.listdir(f"/proc/{pid}/task")} for pid in pids}


def _warnings(log: str) -> list[str]:
    """A log's warnings and errors, for a failure's message."""
    return [line for line in log.splitlines() if "WARNING" in line or "ERROR" in line or "no GIL figures" in line]


@pytest.mark.parametrize("framework, server, preload, hooks", [
    ("flask", "sync", False, "c"), ("flask", "gthread", True, "c"), ("django", "gthread", False, "c"),
    ("flask", "gthread", False, "python"),
])
def test_every_worker_reports_figures(app, collector, backend, framework, server, preload, hooks):
    service = f"{framework}-gunicorn-{server}{'-preload' if preload else ''}"
    service += "-python-hooks" if hooks == "python" else ""
    svc = app(framework, server, service, workers=2, preload=preload, python_hooks=hooks == "python")
    service = f"{service}-{backend}"
    drive(svc.address, "/io,/cpu", 60, concurrency=8)
    workers = _workers(svc.proc.pid)
    assert len(workers) == 2, workers
    assert all(python_hooks_in(pid) == (hooks == "python") for pid in workers)
    op = "GET /{}" if framework == "flask" else "GET {}"
    spans = server_spans(service, op.format("io"), 30) + server_spans(service, op.format("cpu"), 30)
    owners, pending = set(), 0
    for span in spans:
        tags = span["tags"]
        if "gil.status" in tags:  # a worker forked from an instrumented master registers on its first span
            # (spans before say pending; one in flight meanwhile, collector_changed)
            assert backend == "collector" and tags["gil.status"] in ("pending", "collector_changed"), \
                (tags, _warnings(svc.log_text()), _warnings(collector.log_text()))
            pending += 1
            continue
        assert "gil.wait_ms" in tags, tags
        # thread.id is the managed id; a gil.wait event names its blocker by kernel tid too,
        # a thread of the worker that ran the span (its GIL hog or another request's thread).
        for log in span.get("logs", []):
            tid = next(f["value"] for f in log["fields"] if f["key"] == "gil.blocker.thread.native_id")
            owners.add(next((pid for pid, tids in workers.items() if tid in tids), None))
    assert owners == set(workers), "spans from every worker, each blocked by one of its own threads"
    assert pending <= len(spans) // 4, f"{pending} of {len(spans)} spans before their worker registered"
    if backend == "collector":
        log = collector.log_text()
        for pid in workers:
            assert f"pid {pid} (uid 0) registered" in log


@pytest.mark.parametrize("hooks", ["c", "python"])
def test_the_slowest_requests_name_the_hog_as_top_blocker(app, backend, hooks):
    """gthread workers serve requests on several threads: the last thread to hand them the GIL
    is often another request, but the one that held it longest is the metrics-collector. After
    a warm-up: the first requests wait on the first one's thread, busy with what a fresh
    worker does once (imports, its first span), and rightly name it."""
    service = f"flask-gunicorn-blame{'-python-hooks' if hooks == 'python' else ''}"
    svc = app("flask", "gthread", service, workers=1, hog=True, python_hooks=hooks == "python")
    drive(svc.address, "/io", 8, concurrency=4)
    assert all(python_hooks_in(pid) == (hooks == "python") for pid in _workers(svc.proc.pid))
    since_us = time.time_ns() // 1000
    drive(svc.address, "/io", 80, concurrency=4)
    served = [s for s in server_spans(f"{service}-{backend}", "GET /io", 88) if s["startTime"] >= since_us]
    assert len(served) == 80, len(served)
    spans = sorted(served, key=lambda s: s["duration"], reverse=True)[:10]
    tops = [s["tags"].get("gil.top_blocker.thread.name") for s in spans]
    # Another request's thread is the top blocker only by holding longer than the hog did
    # meanwhile (seen: one hold of ~60 ms, as a garbage collection or a preemption of the
    # holder makes), in some of the slowest requests; never for the last hand-off alone.
    assert tops.count("metrics-collector") >= 6, tops
    others = [s["tags"]["gil.top_blocker.hold_ms"] for s in spans if s["tags"].get("gil.top_blocker.thread.name") != "metrics-collector"]
    assert all(held >= 20 for held in others), others
    for s in spans:
        tags = s["tags"]
        if tags.get("gil.top_blocker.thread.name") == "metrics-collector":
            assert 0 < tags["gil.top_blocker.hold_ms"] <= tags["gil.wait_ms"] + 0.01, tags

"""Pre-fork servers: every gunicorn worker re-registers after fork (on its first span)
and its spans carry its own figures (sync and gthread workers, with and without --preload)."""

import os

import pytest

from helpers import drive, server_spans


def _workers(master: int) -> dict[int, set[int]]:
    """Worker pid -> its thread ids, read from /proc while they run."""
    with open(f"/proc/{master}/task/{master}/children") as f:
        pids = [int(p) for p in f.read().split()]
    return {pid: {int(t) for t in os.listdir(f"/proc/{pid}/task")} for pid in pids}


@pytest.mark.parametrize(
    "framework, server, preload", [("flask", "sync", False), ("flask", "gthread", True), ("django", "gthread", False)]
)
def test_every_worker_reports_figures(app, collector, framework, server, preload):
    service = f"{framework}-gunicorn-{server}{'-preload' if preload else ''}"
    svc = app(framework, server, service, workers=2, preload=preload)
    drive(svc.address, "/io,/cpu", 60, concurrency=8)
    workers = _workers(svc.proc.pid)
    assert len(workers) == 2, workers
    op = "GET /{}" if framework == "flask" else "GET {}"
    spans = server_spans(service, op.format("io"), 30) + server_spans(service, op.format("cpu"), 30)
    owner = {}
    for span in spans:
        tags = span["tags"]
        # A worker forked from an instrumented master registers on its first span:
        # those before its registration say so.
        assert tags.get("gil.status", "pending") == "pending" and ("gil.wait_ms" in tags) != ("gil.status" in tags), tags
        owner[span["spanID"]] = next((pid for pid, tids in workers.items() if tags["thread.id"] in tids), None)
    assert set(owner.values()) == set(workers), "spans from every worker, each from one of its threads"
    for pid in workers:
        mine = sorted((s for s in spans if owner[s["spanID"]] == pid), key=lambda s: s["startTime"])
        pending = [s for s in mine if "gil.status" in s["tags"]]
        assert mine[: len(pending)] == pending, "pending only until the worker's registration"
        assert len(pending) <= len(mine) // 2, (len(pending), len(mine))
    log = collector.log_text()
    for pid in workers:
        assert f"pid {pid} (uid 0) registered" in log

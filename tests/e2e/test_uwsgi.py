"""uWSGI, the pre-fork server that forks its workers in C: every worker's spans get its own
figures, with both backends, with --lazy-apps (no Python at-fork hook runs; the app loads in
each worker) and with the app in the master (then --py-call-uwsgi-fork-hooks, without which a
worker forked while another thread held the GIL never gets it); until a worker has figures its
spans say gil.status, never a zero; with the C span hooks, and (lazy-apps) with the Python ones
alone. A fork from C with no hook at all: the cfork scenario."""

import collections
import os

import pytest

from helpers import drive, python_hooks_in, server_spans


def _workers(master: int) -> dict[int, set[int]]:
    """Worker pid -> its thread ids (kernel tids), read from /proc while they run."""
    with open(f"/proc/{master}/task/{master}/children") as f:
        pids = [int(p) for p in f.read().split()]
    return {pid: {int(t) for t in os.listdir(f"/proc/{pid}/task")} for pid in pids}


@pytest.mark.parametrize("lazy, hooks", [(False, "c"), (True, "c"), (True, "python")],
                         ids=["app-in-master", "lazy-apps", "lazy-apps-python-hooks"])
def test_every_uwsgi_worker_has_its_own_figures(app, collector, backend, lazy, hooks):
    service = f"flask-uwsgi{'-lazy' if lazy else ''}{'-python-hooks' if hooks == 'python' else ''}"
    svc = app("flask", "uwsgi", service, workers=2, preload=not lazy, hog=True, python_hooks=hooks == "python")
    drive(svc.address, "/io", 80, concurrency=4)
    workers = _workers(svc.proc.pid)
    assert len(workers) == 2, workers
    assert all(python_hooks_in(pid) == (hooks == "python") for pid in workers)
    spans = server_spans(f"{service}-{backend}", "GET /io", 80)
    measured = [s for s in spans if "gil.status" not in s["tags"]]
    # A worker registers on its first span: spans before say pending, one in flight then
    # collector_changed (its start and end read different rings).
    assert {s["tags"]["gil.status"] for s in spans if s not in measured} <= {"pending", "collector_changed"}
    assert len(measured) >= 0.8 * len(spans), [s["tags"].get("gil.status") for s in spans]
    owners = collections.Counter()
    for span in measured:
        tags = span["tags"]
        assert tags["gil.wait_ms"] + tags["gil.hold_ms"] <= span["duration"] / 1e3 + 0.01, tags
        for log in span.get("logs", []):
            tid = next(f["value"] for f in log["fields"] if f["key"] == "gil.blocker.thread.native_id")
            owners[next((pid for pid, tids in workers.items() if tid in tids), None)] += 1
    assert owners.keys() == set(workers), ("each worker's spans waited on its own threads (its hog); waits by "
                                           f"the blocker's process: {dict(owners)}, of {len(measured)} spans measured")
    slowest = sorted(measured, key=lambda s: s["duration"], reverse=True)[:10]
    tops = [s["tags"].get("gil.top_blocker.thread.name") for s in slowest]
    assert tops.count("metrics-collector") >= 8, tops
    if backend == "collector":
        log = collector.log_text()
        for pid in workers:
            assert f"pid {pid} (uid 0) registered" in log

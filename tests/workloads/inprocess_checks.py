"""Workloads for the in-process backend's robustness, run in their own process.

Usage: python inprocess_checks.py CHECK [SOCKET]; prints one JSON document.
Ground truth as in scenarios.py: a ``ctypes.PyDLL`` call keeps the GIL.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import threading
import time

from otel_gil import _inprocess
from otel_gil import ring as ringlib
from otel_gil.client import Registration
from otel_gil.inprocess import InProcess

_holding = ctypes.PyDLL(None)  # calls keep the GIL


def _counters(ring: ringlib.Ring, tid: int) -> dict:
    index = ring.find(tid)
    c = ringlib.counters(ring.snapshot(index), time.monotonic_ns()) if index >= 0 else ringlib.ZERO
    return c._asdict()


def _io_loop(iterations: int, hold_us: int = 0) -> None:
    """Two GIL hand-offs an iteration (os.write, os.read), and a PyDLL hold of ``hold_us`` if asked."""
    r, w = os.pipe()
    for _ in range(iterations):
        os.write(w, b"x")
        os.read(r, 1)
        if hold_us:
            _holding.usleep(hold_us)
    os.close(r)
    os.close(w)


def _hog_and_victim(bursts: int, burst_ms: int, read_both) -> dict:
    """A PyDLL hog wakes a victim and holds the GIL; ``read_both()`` runs while both threads live."""
    r, w = os.pipe()
    truth = {"hold_ns": 0, "victim_wait_ns": 0}
    ready, done, release = threading.Barrier(3), threading.Barrier(3), threading.Event()

    def victim() -> None:
        ready.wait()
        for _ in range(bursts):
            os.read(r, 1)
        done.wait()
        release.wait()

    def hog() -> None:
        ready.wait()
        time.sleep(0.02)
        for _ in range(bursts):
            t_write = time.monotonic_ns()
            _holding.write(w, b"x", 1)
            t0 = time.monotonic_ns()
            _holding.usleep(burst_ms * 1000)
            t1 = time.monotonic_ns()
            truth["hold_ns"] += t1 - t0
            truth["victim_wait_ns"] += t1 - t_write
            time.sleep(0.005)
        done.wait()
        release.wait()

    threads = [threading.Thread(target=victim, name="victim"), threading.Thread(target=hog, name="gil-hog")]
    for t in threads:
        t.start()
    ready.wait()
    done.wait()
    truth["figures"] = read_both({"victim": threads[0].native_id, "hog": threads[1].native_id})
    release.set()
    for t in threads:
        t.join()
    return truth


def dual(socket_path: str) -> dict:
    """Both writers on one process at once, each into its own ring: the collector's probes
    and the in-process hooks see the same hand-offs."""
    registration = Registration(socket_path)
    registration.start()
    registration.wait(30)
    assert registration.state.status == "ok", registration.state.detail
    inprocess = InProcess()
    inprocess.start()
    assert inprocess.state.status == "ok", inprocess.state.detail
    deadline = time.monotonic() + 10
    while not registration.state.ring.header.switch_cond and time.monotonic() < deadline:
        time.sleep(0.01)  # the collector learns the GIL from a take_gil of ours

    rings = {"collector": registration.state.ring, "inprocess": inprocess.state.ring}
    main = threading.get_native_id()

    def read_both(tids: dict) -> dict:
        return {kind: {name: _counters(ring, tid) for name, tid in tids.items()} for kind, ring in rings.items()}

    loops = {}
    for name, iterations, hold_us in (("loop", 20_000, 0), ("loop_holding", 2_000, 50)):
        before, located = read_both({"main": main}), inprocess.state.ring.header.locations_written
        _io_loop(iterations, hold_us)
        after = read_both({"main": main})
        loops[name] = {kind: {k: after[kind]["main"][k] - before[kind]["main"][k] for k in before[kind]["main"]}
                       for kind in rings}
        loops[f"{name}_iterations"] = iterations
        loops[f"{name}_located"] = inprocess.state.ring.header.locations_written - located
    truth = _hog_and_victim(5, 50, read_both)
    registration.stop()
    inprocess.stop()
    return {**loops, **truth}


def located(_: str) -> dict:
    """The hooks copy a logged hold's location only where a thread waited through the hold: a
    lone thread's holds (an event loop's between polls) get none, a hog's that keep a victim
    waiting each get theirs."""
    inprocess = InProcess()
    inprocess.start()
    header = inprocess.state.ring.header

    def phase(run) -> dict:
        holds, located = header.holds_written, header.locations_written
        run()
        return {"holds": header.holds_written - holds, "located": header.locations_written - located}

    iterations, bursts = 200, 5
    alone = phase(lambda: _io_loop(iterations, 300))  # holds of 0.3 ms: past the log's 0.1 ms
    contended = phase(lambda: _hog_and_victim(bursts, 20, lambda tids: {}))
    inprocess.stop()
    return {"alone": {**alone, "iterations": iterations}, "contended": {**contended, "bursts": bursts}}


def fork(_: str) -> dict:
    """The child keeps the hooks and starts its ring afresh; the parent's figures are untouched."""
    inprocess = InProcess()
    inprocess.start()
    tid = threading.get_native_id()
    t0 = time.monotonic_ns()
    _holding.usleep(30_000)
    parent_truth = time.monotonic_ns() - t0
    before = _counters(inprocess.state.ring, tid)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        child_tid = threading.get_native_id()
        start = _counters(inprocess.state.ring, child_tid)
        t0 = time.monotonic_ns()
        _holding.usleep(50_000)
        truth = time.monotonic_ns() - t0
        time.sleep(0.001)  # a release: the hold is closed
        end = _counters(inprocess.state.ring, child_tid)
        child = {"pid": os.getpid(), "header_pid": inprocess.state.ring.header.pid, "start": start, "end": end,
                 "truth_hold_ns": truth, "threads": [s.tid for s in inprocess.state.ring.threads()], "tid": child_tid,
                 "forks": _inprocess.forks()}
        os.write(w, json.dumps(child).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as pipe:
        child = json.loads(pipe.read())
    os.waitpid(pid, 0)
    after = _counters(inprocess.state.ring, tid)
    return {"parent": {"pid": os.getpid(), "header_pid": inprocess.state.ring.header.pid, "before": before, "after": after,
                       "truth_hold_ns": parent_truth, "forks": _inprocess.forks()}, "child": child}


def dlopen(_: str) -> dict:
    """Libraries loaded after install (a C library and an extension module) change nothing."""
    inprocess = InProcess()
    inprocess.start()
    hooked = _inprocess.got_entries()
    ctypes.CDLL("libm.so.6").sqrt  # a C library mapped now
    import _decimal  # noqa: F401  an extension module loaded now, with its own GOT
    import sqlite3

    sqlite3.connect(":memory:").execute("select 1")
    truth = _hog_and_victim(3, 50, lambda tids: {n: _counters(inprocess.state.ring, t) for n, t in tids.items()})
    return {"hooked_before": hooked, "hooked_after": _inprocess.got_entries(), **truth}


def cycles(_: str) -> dict:
    """2,000 install/uninstall cycles while two threads hand the GIL back and forth; then
    the hooks still count every hand-off, and uninstall restores the original GOT values."""
    stop = threading.Event()
    errors: list[str] = []

    def churn() -> None:
        try:
            while not stop.is_set():
                _io_loop(100)
        except Exception as exc:  # reported, not raised: the check is that nothing breaks
            errors.append(repr(exc))

    workers = [threading.Thread(target=churn, name=f"io-{i}") for i in range(2)]
    for t in workers:
        t.start()
    inprocess = InProcess()
    originals = None
    for _ in range(2000):
        inprocess.start()
        assert inprocess.state.status == "ok", inprocess.state.detail
        if originals is None:
            originals = {e["symbol"]: e["original"] for e in _inprocess.got_entries()}
        inprocess.stop()
    restored = _inprocess.got_entries()
    inprocess.start()
    time.sleep(0.2)  # the workers' hand-offs under the final install
    stop.set()
    for t in workers:
        t.join()
    tid = threading.get_native_id()
    before = _counters(inprocess.state.ring, tid)
    _io_loop(10_000)
    after = _counters(inprocess.state.ring, tid)
    stale = [s.tid for s in inprocess.state.ring.threads() if s.wait_start_ns]  # nobody is waiting now
    inprocess.stop()
    return {"errors": errors, "originals": originals, "restored": restored, "final": _inprocess.got_entries(),
            "acquisitions": after["acquisitions"] - before["acquisitions"], "iterations": 10_000,
            "hold_ns": after["hold_ns"] - before["hold_ns"], "wait_ns": after["wait_ns"] - before["wait_ns"],
            "stale_waits": stale}


if __name__ == "__main__":
    checks = {"dual": dual, "located": located, "fork": fork, "dlopen": dlopen, "cycles": cycles}
    json.dump(checks[sys.argv[1]](sys.argv[2] if len(sys.argv) > 2 else ""), sys.stdout)

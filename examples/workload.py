"""What the example services do, shared by the Flask and the Django app.

The routes' work (``io_bound``, ``cpu_bound``, ``slow_c``) and the culprit of the
"Is it me, or the GIL?" talk: a background ``metrics-collector`` thread that, on a
timer, crunches numbers in pure Python (``compute_stats``) and so holds the GIL. Every request thread
that comes back from a blocking call must then wait for the GIL.

The hog starts lazily, on a process's first request (``ensure_hog``), so that each
worker of a pre-fork server runs its own, also with ``gunicorn --preload``
(threads do not survive ``fork``), and a gunicorn master never runs one.

Environment: ``EXAMPLE_GIL_HOG=0`` switches the hog off; ``EXAMPLE_HOG_BUSY_MS``
(default 40) and ``EXAMPLE_HOG_PERIOD_MS`` (default 50) shape it.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time

HOG_THREAD_NAME = "metrics-collector"

_hog_pid = 0  # the process whose hog runs: a forked child has a different pid
_hog_lock = threading.Lock()
_hog_paused = threading.Lock()  # held by blocked(): the hog waits on it (without the GIL) meanwhile
BLOCKER_THREAD_NAME = "gil-holder"
BLOCKED_MS = 200
_gil_holding_libc = ctypes.PyDLL(None)  # unlike ctypes.CDLL, calls through PyDLL keep the GIL


def _env_seconds(name: str, default_ms: float) -> float:
    """A duration given in milliseconds by environment variable ``name``, in seconds."""
    return float(os.environ.get(name, default_ms)) / 1000


def compute_stats(samples: int = 100) -> int:
    """A few microseconds of pure-Python arithmetic (the metrics' aggregation): the GIL is held throughout."""
    total = 0
    for i in range(samples):
        total += i * i
    return total


def _metrics_collector(busy: float, period: float) -> None:
    """Every ``period`` seconds, aggregate "metrics" in pure Python for ``busy`` seconds."""
    next_round = time.monotonic()
    while True:
        with _hog_paused:
            until = next_round + busy
            while time.monotonic() < until:
                compute_stats()
        next_round += period
        time.sleep(max(next_round - time.monotonic(), 0.001))


def ensure_hog() -> None:
    """Start this process's ``metrics-collector`` thread unless it runs (or ``EXAMPLE_GIL_HOG=0``)."""
    global _hog_pid, _hog_paused
    if _hog_pid == os.getpid() or os.environ.get("EXAMPLE_GIL_HOG", "1") == "0":
        return
    with _hog_lock:
        if _hog_pid != os.getpid():
            _hog_paused = threading.Lock()  # a fork's copy may be held by a hog that is not in this process
            busy, period = _env_seconds("EXAMPLE_HOG_BUSY_MS", 40), _env_seconds("EXAMPLE_HOG_PERIOD_MS", 50)
            threading.Thread(target=_metrics_collector, args=(busy, period), name=HOG_THREAD_NAME, daemon=True).start()
            _hog_pid = os.getpid()


def io_bound() -> str:
    """Ten 2 ms blocking waits, like small database queries: each gives the GIL up."""
    for _ in range(10):
        time.sleep(0.002)
    return "io done\n"


def cpu_bound() -> str:
    """20 ms of this thread's CPU time in pure Python: longer in wall time when the GIL is contended."""
    until, rounds = time.thread_time() + 0.02, 0
    while time.thread_time() < until:
        compute_stats()
        rounds += 1
    return f"cpu done ({rounds} rounds)\n"


def slow_c() -> str:
    """A 20 ms C call that does not release the GIL: everyone else waits."""
    _gil_holding_libc.usleep(20_000)
    return "slow C call done\n"


def blocked() -> str:
    """A known wait (a ground truth): a thread of ours holds the GIL for BLOCKED_MS in a C call
    (ctypes.PyDLL keeps it) from the moment it starts, and this request waits it out; the hog
    pauses meanwhile, so the request waits for that thread alone. The answer says how long the
    hold took, timed inside it (a loaded host's usleep oversleeps)."""
    held: list[int] = []
    with _hog_paused:
        holder = threading.Thread(target=_hold, args=(BLOCKED_MS, held), name=BLOCKER_THREAD_NAME)
        holder.start()  # returns once the holder runs: it holds the GIL then, until its call returns
        holder.join()
    return f"waited for {BLOCKER_THREAD_NAME}'s hold of {held[0] / 1e6:.3f} ms\n"


def _hold(ms: int, held: list[int]) -> None:
    start = time.perf_counter_ns()  # the GIL held from here to the second read, without a break
    _gil_holding_libc.usleep(ms * 1000)
    held.append(time.perf_counter_ns() - start)


def health() -> str:
    """The liveness answer."""
    return "ok\n"

"""The ground truth of a piece of code's GIL hold, for the workloads of the context tests.

A piece of pure Python holds the GIL for its CPU time (thread_time), and also while the
kernel has preempted it: on a loaded machine that is much of it. So a piece's truth is the
thread's CPU time plus its runqueue time (/proc/thread-self/schedstat) across it. That
counts too the moments the thread, made to drop the GIL by another thread, was woken and
waited for a CPU (a wait, to the writers): pieces here rarely meet another thread. Where
/proc is not mounted (a plain chroot), CPU time alone.

A call through ctypes.PyDLL keeps the GIL while it sleeps: its truth is its wall time.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time

_gil_holding_libc = ctypes.PyDLL(None)
_schedstat = threading.local()


def held_ns() -> int:
    """The calling thread's CPU plus runqueue time, ns (CPU time alone without /proc). The CPU
    time is thread_time's: schedstat's own lags for a running thread until the next tick; its
    runqueue time is current whenever the thread runs (it is added as the thread gets a CPU)."""
    fd = getattr(_schedstat, "fd", None)
    if fd is None:
        try:
            fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except FileNotFoundError:
            fd = -1
        _schedstat.fd = fd
    cpu = time.thread_time_ns()
    return cpu if fd < 0 else cpu + int(os.pread(fd, 64, 0).split()[1])


def spin(ms: float) -> int:
    """Pure Python for ``ms`` of wall time; its truth (ns)."""
    t0 = held_ns()
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass
    return held_ns() - t0


def pydll_hold(ms: float) -> int:
    """Keep the GIL for ``ms`` through a PyDLL call; its wall time (ns)."""
    t0 = time.monotonic_ns()
    _gil_holding_libc.usleep(int(ms * 1000))
    return time.monotonic_ns() - t0

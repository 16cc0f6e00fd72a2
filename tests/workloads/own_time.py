"""The ground truth of a piece of code's GIL hold, for the workloads of the context tests.

A piece of pure Python that runs between its thread's switches holds the GIL from its start
to its end but while it was made to drop it (at a switch interval, for another thread): its
truth is what its thread held meanwhile, the thread's own figures (its slot), which the PyDLL
ground truths check on every build; what these truths check is whose they are. Not its wall
time minus its waits: after a forced switch, a thread that asks for the GIL again only once
a third thread took it (on a CPU shared by many threads, often) starts its wait at its asking
(gil_writer.h, STALE_CHECK), and the stretch before, held by the others, is neither its hold
nor its wait (measured on Django's loop beside 20 request threads: each request under its
truth by the sum of those stretches, 4-17 ms of 92). Its CPU time (thread_time) is a lower bound only: the
kernel preempts a thread that holds the GIL too (on a 2-core machine, for the load generator,
Jaeger, the app's exporter thread), and it holds it meanwhile.

A call through ctypes.PyDLL keeps the GIL while it sleeps: its truth is the time asked.
"""

from __future__ import annotations

import ctypes
import threading
import time
from typing import NamedTuple

from otel_gil import GilInstrumentor
from otel_gil.ring import ZERO, Counters

_gil_holding_libc = ctypes.PyDLL(None)


class Held(NamedTuple):
    """A piece's truth (ns): held (wall time minus waits) and its CPU time."""

    ns: int
    cpu_ns: int


def read() -> tuple[int, Counters]:
    """The monotonic time and the calling thread's figures up to it (its slot, in the ring of
    this process's backend, read with the clock: a hand-off between two bytecodes could fall
    between separate reads of the two), or (now, zeros) where it has no slot."""
    backend = GilInstrumentor._backend
    ring = backend.state.ring if backend is not None else None
    tid = threading.get_native_id()
    index = ring.find(tid) if ring is not None else -1
    figures = ring.read(index, tid) if index >= 0 else None
    return figures or (time.monotonic_ns(), ZERO)


def waits() -> int:
    """The calling thread's GIL waits so far (ns)."""
    return read()[1].wait_ns


def clock() -> Held:
    """A reading of the truth's clocks (its slot's hold; the wall clock where it has none): the
    difference of two readings is the truth of what ran between them on this thread (no
    blocking call in between)."""
    now_ns, figures = read()
    return Held(now_ns if figures is ZERO else figures.hold_ns, time.thread_time_ns())


def since(start: Held) -> Held:
    now = clock()
    return Held(now.ns - start.ns, now.cpu_ns - start.cpu_ns)


def spin(ms: float) -> Held:
    """Pure Python for ``ms`` of wall time; its truth."""
    start = clock()
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass
    return since(start)


def pydll_hold(ms: float) -> Held:
    """Keep the GIL for ``ms`` through a PyDLL call; its truth: ``ms`` (no CPU). The call holds it
    that long and a few tens of µs more (a sleep's overshoot); timing it from Python would also
    time the wait of a thread made to drop the GIL just before the call."""
    _gil_holding_libc.usleep(int(ms * 1000))
    return Held(int(ms * 1e6), 0)


def pydll_hold_counted(ms: float) -> Held:
    """pydll_hold(ms) as its thread's slot counted it (clock and since around the call): the
    sleep's overshoot too, which the thread holds as well (the timer slack, ~50 µs a call: a
    bound on a sum of many such holds would be short by that much each)."""
    start = clock()
    pydll_hold(ms)
    return since(start)


def total(*pieces: Held) -> Held:
    return Held(sum(p.ns for p in pieces), sum(p.cpu_ns for p in pieces))

"""The ``cpython.parked.time`` counter (s): time the process's threads parked, by what they
parked on (attribute ``cpython.park.kind``), while a free-threaded build ran without its GIL
(``otel_gil.parks``). Prometheus sees ``cpython_parked_time_seconds_total``; the share of wall
time the threads spent suspended for stop-the-world pauses is
``sum(rate(cpython_parked_time_seconds_total{cpython_park_kind="stop_the_world"}[5m]))``.

Process-wide: the live threads' slots (an open park counted up to now) plus the totals of the
threads that exited (the header's, read as of no exit half-added). A thread that exits between
the two reads is missed once; the counter then repeats its last value rather than go down.
"""

from __future__ import annotations

import os
import time
from typing import Iterable, Optional

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from otel_gil import parks
from otel_gil import ring as ringlib
from otel_gil.semconv import PARK_KIND, PARK_KINDS, PARKED_TIME

_TRIES = 100


def totals(ring: ringlib.Ring) -> Optional[list[int]]:
    """ns parked by kind, over every thread the ring has seen; None if a read met a writer each try."""
    h = ring.header
    for _ in range(_TRIES):
        exits = h.exited_threads
        total = list(h.exited_parked_ns)
        if h.exits_started == exits:
            break
    else:
        return None
    try:
        slots = list(ring.threads())
    except ringlib.BusySlot:
        return None
    now = time.monotonic_ns()
    for slot in slots:
        for kind in range(ringlib.PARK_KINDS):
            total[kind] += slot.parked_ns[kind]
        if slot.park_start_ns and now > slot.park_start_ns:
            total[min(slot.park_kind, ringlib.PARK_OTHER)] += now - slot.park_start_ns
    return total


class ParkMetrics:
    """Registers the counter on ``meter`` (once per meter: its callback reads whichever parks are hooked)."""

    def __init__(self, meter: Meter) -> None:
        self._last = [0] * ringlib.PARK_KINDS
        self._ring: Optional[ringlib.Ring] = None
        self._pid = os.getpid()
        meter.create_observable_counter(PARKED_TIME, [self._observe], unit="s",
                                        description="Time threads parked without a GIL, by what they parked on")

    def _observe(self, options: CallbackOptions) -> Iterable[Observation]:
        hooked = parks.current
        if hooked is None:
            return []
        if not hooked.ring.continues(self._ring) or os.getpid() != self._pid:  # new slots (a fork: wiped)
            self._ring, self._last, self._pid = hooked.ring, [0] * ringlib.PARK_KINDS, os.getpid()
        now = totals(hooked.ring)
        if now is not None:
            self._last = [max(n, last) for n, last in zip(now, self._last)]
        return [Observation(ns / 1e9, {PARK_KIND: kind}) for kind, ns in zip(PARK_KINDS, self._last)]

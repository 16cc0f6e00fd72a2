"""The ``cpython.parked.time`` counter (s): time threads parked, by what they parked on
(attributes ``cpython.park.kind`` and ``thread.name``), while a free-threaded build ran without
its GIL (``otel_gil.parks``). Prometheus sees ``cpython_parked_time_seconds_total``; the share of
wall time a process's threads spent suspended for stop-the-world pauses is
``sum by (job, instance) (rate(cpython_parked_time_seconds_total{cpython_park_kind="stop_the_world"}[5m]))``.

Per thread name as the ``gil.*`` counters are (``metrics.Totals``: kept monotonic across thread
exits and tid reuse, exited threads' parks folded from the header's totals).
"""

from __future__ import annotations

import os
import time
from typing import Iterable, Optional

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from otel_gil import parks, threads
from otel_gil import ring as ringlib
from otel_gil.metrics import Totals
from otel_gil.semconv import PARK_KIND, PARK_KINDS, PARKED_TIME, THREAD_NAME


class ParkedTotals(Totals):
    """``Totals`` over the slots' parked time by kind (an open park counted up to now)."""

    width = ringlib.PARK_KINDS

    def values(self, slot: ringlib.Slot, now_ns: int) -> list[int]:
        parked = list(slot.parked_ns)
        if slot.park_start_ns and now_ns > slot.park_start_ns:
            parked[min(slot.park_kind, ringlib.PARK_OTHER)] += now_ns - slot.park_start_ns
        return parked

    def exited(self, header: ringlib.Header) -> list[int]:
        return list(header.exited_parked_ns)


class ParkMetrics:
    """Registers the counter on ``meter`` (once per meter: its callback reads whichever parks are hooked)."""

    def __init__(self, meter: Meter) -> None:
        self._totals = ParkedTotals()
        self._pid = os.getpid()
        meter.create_observable_counter(PARKED_TIME, [self._observe], unit="s",
                                        description="Time threads parked without a GIL, by what they parked on")

    def _observe(self, options: CallbackOptions) -> Iterable[Observation]:
        hooked: Optional[parks.Parks] = parks.current
        if hooked is None:
            return []
        if os.getpid() != self._pid:  # a forked child: its slots started afresh at the same address
            self._totals, self._pid = ParkedTotals(), os.getpid()
        self._totals.update(hooked.ring, time.monotonic_ns(), threads.take_starts())
        return [Observation(ns / 1e9, {THREAD_NAME: name, PARK_KIND: kind})
                for name, values in list(self._totals.by_name.items()) for kind, ns in zip(PARK_KINDS, values)]

"""GIL metrics: cumulative counters per thread (exact rates over any window) and the
wait ratio of server spans per route (for quantile alerts).

Instruments (OpenTelemetry names; Prometheus sees ``gil_wait_time_seconds_total``, ...):
``gil.wait.time`` and ``gil.hold.time`` (s), ``gil.acquisitions``, ``gil.convoy_waits``
(attribute ``thread.name``), and the histogram ``gil.wait_ratio`` (``http.route``).
The process's share of wall time waiting (can exceed 1, one thread each) is
``sum(rate(gil_wait_time_seconds_total[5m]))``; holding: the same with ``hold``.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Iterable, Optional

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from otel_gil import ring as ringlib
from otel_gil import threads
from otel_gil.client import REGISTERED, Registration

_FIELDS = ("wait_ns", "hold_ns", "acquisitions", "convoy_waits")
_EXITED = ("exited_wait_ns", "exited_hold_ns", "exited_acquisitions", "exited_convoy_waits")
EXITED_THREADS = "(exited threads)"
_HEADER_TRIES = 100
_RATIO_BUCKETS = (0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0)


def _reset(new: list[int], old: list[int]) -> bool:
    """A slot whose counters went down now belongs to another thread (tid reused)."""
    return any(n < o for n, o in zip(new, old))


class Totals:
    """Per-thread-name cumulative figures, kept monotonic across thread exits and tid reuse.

    Live threads are read from their slots. A thread that exits takes with it what it
    added since the last read; the header's exited totals have it (the BPF side frees
    the slot first and adds the exit after, the header is read before the slots, and
    only as of no exit half-added: so nothing is counted twice). It goes to that thread's name, or to
    ``(exited threads)`` when several exits are folded at once. The sum over names
    always equals the process's true total.
    """

    def __init__(self) -> None:
        self.by_name: dict[str, list[int]] = {}
        self._ring: Optional[ringlib.Ring] = None

    def _reset(self, ring: ringlib.Ring) -> None:
        self._ring = ring
        self._seen: dict[int, tuple[str, list[int]]] = {}  # tid -> (name, values last read)
        self._departed: collections.deque[tuple[str, list[int]]] = collections.deque()
        self._exited, self._exits = [0, 0, 0, 0], 0

    def _add(self, name: str, delta: list[int]) -> None:
        total = self.by_name.setdefault(name, [0, 0, 0, 0])
        for i, d in enumerate(delta):
            total[i] += d

    def update(self, ring: ringlib.Ring, now_ns: int) -> bool:
        """Read ``ring``; False (nothing changed) if an exit was half-added or a slot stayed busy."""
        if ring is not self._ring:  # a new registration: new slots, new exited totals
            self._reset(ring)
        exited_totals = _exited(ring.header)
        if exited_totals is None:
            return False
        exited, exits = exited_totals
        names = threads.names()
        try:
            slots = list(ring.threads())
        except ringlib.BusySlot:
            return False
        live: dict[int, tuple[str, list[int]]] = {}
        for slot in slots:
            c = ringlib.counters(slot, now_ns)
            values = [c.wait_ns, c.hold_ns, c.acquisitions, c.convoy_waits]
            old = self._seen.pop(slot.tid, None)
            if old is not None and not _reset(values, old[1]):
                name, delta = old[0], [v - o for v, o in zip(values, old[1])]
            else:  # first sight, or the tid now belongs to a new thread
                if old is not None:
                    self._departed.append(old)
                name, delta = threads.name(slot.tid, names) or str(slot.tid), values
            self._add(name, delta)
            live[slot.tid] = (name, values)
        self._departed.extend(self._seen.values())  # not seen any more: exited
        self._seen = live
        folded = exits - self._exits
        gone = [self._departed.popleft() for _ in range(min(folded, len(self._departed)))]
        remainder = [max(e - p - sum(g[1][i] for g in gone), 0) for i, (e, p) in enumerate(zip(exited, self._exited))]
        if any(remainder):
            self._add(gone[0][0] if folded == len(gone) == 1 else EXITED_THREADS, remainder)
        self._exited, self._exits = exited, exits
        return True


def _exited(header: ringlib.Header) -> Optional[tuple[list[int], int]]:
    """The header's exited totals and count, as of no exit half-added: the BPF side bumps
    ``exits_started``, adds the totals, then bumps ``exited_threads``; equal counts read
    around the totals mean none was in between. None if every try met an exit in progress."""
    for _ in range(_HEADER_TRIES):
        exits = header.exited_threads
        exited = [getattr(header, f) for f in _EXITED]
        if header.exits_started == exits & 0xFFFFFFFF:
            return exited, exits
    return None


class GilMetrics:
    """Registers the instruments on ``meter``; reads the ring once per collection."""

    def __init__(self, registration: Registration, meter: Meter) -> None:
        self._registration = registration
        self._totals = Totals()
        self._lock = threading.Lock()
        scale = (1e-9, 1e-9, 1, 1)
        for i, (name, unit, description) in enumerate(
            (
                ("gil.wait.time", "s", "Time threads waited for the GIL"),
                ("gil.hold.time", "s", "Time threads held the GIL"),
                ("gil.acquisitions", "{acquisition}", "GIL acquisitions"),
                ("gil.convoy_waits", "{wait}", "Waits for the GIL at least one switch interval long"),
            )
        ):
            meter.create_observable_counter(name, [self._callback(i, scale[i])], unit=unit, description=description)
        self._ratio = meter.create_histogram(
            "gil.wait_ratio", unit="1", description="Share of a server span's duration spent waiting for the GIL",
            explicit_bucket_boundaries_advisory=_RATIO_BUCKETS,
        )

    def _refresh(self) -> None:
        with self._lock:
            ring = self._registration.ring
            if ring is not None and self._registration.status == REGISTERED:
                self._totals.update(ring, time.monotonic_ns())

    def _callback(self, index: int, scale: float):
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            if index == 0:  # a collection runs the callbacks in order: one read serves all four
                self._refresh()
            for name, values in list(self._totals.by_name.items()):
                value = values[index] * scale
                yield Observation(value if scale != 1 else int(value), {"thread.name": name})

        return observe

    def record_span(self, wait_ratio: float, route: str) -> None:
        self._ratio.record(wait_ratio, {"http.route": route})

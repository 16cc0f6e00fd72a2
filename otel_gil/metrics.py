"""GIL metrics: cumulative counters per thread (exact rates over any window) and the
wait ratio of server spans per route (for quantile alerts).

Instruments (OpenTelemetry names; Prometheus sees ``gil_wait_time_seconds_total``, ...):
``gil.wait.time`` and ``gil.hold.time`` (s), ``gil.acquisitions``, ``gil.convoy_waits``
(attribute ``thread.name``), and the distribution of server spans' wait ratio per
``http.route`` as a cumulative histogram in Prometheus' classic shape:
``gil.wait_ratio.bucket`` (attribute ``le``), ``gil.wait_ratio.count`` and ``gil.wait_ratio.sum``;
``gil.location.misses``, logged holds whose code location was not read (attribute ``reason``,
a handful of values); on a free-threaded build, the gauge ``gil.enabled`` once its GIL is on
(``free_threading``). No metric carries code locations: those are on spans.
The SDK's synchronous ``Histogram.record`` costs 8-16 µs, most of a span's own cost:
:class:`WaitRatios` counts into buckets itself (well under a µs) and the counters are read at collection.
The process's share of wall time waiting (can exceed 1, one thread each) is
``sum(rate(gil_wait_time_seconds_total[5m]))``; holding: the same with ``hold``.

``thread.name`` stays bounded: the numbers CPython puts in default names are replaced by
``N`` (``Thread-104 (process_request_thread)`` -> ``Thread-N (process_request_thread)``),
and past :data:`MAX_THREAD_NAMES` names new ones go to ``(other threads)``.
"""

from __future__ import annotations

import bisect
import collections
import re
import threading
import time
from typing import Callable, Iterable, Optional, TypeVar

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from otel_gil import free_threading
from otel_gil import ring as ringlib
from otel_gil import threads
from otel_gil.backend import Backend
from otel_gil.semconv import GIL_ENABLED, HTTP_ROUTE, LE, REASON, REGISTERED, THREAD_NAME

_FIELDS = ("wait_ns", "hold_ns", "acquisitions", "convoy_waits")
_EXITED = ("exited_wait_ns", "exited_hold_ns", "exited_acquisitions", "exited_convoy_waits")
EXITED_THREADS = "(exited threads)"
_HEADER_TRIES = 100
_PATIENCE_S = 0.05
T = TypeVar("T")
OTHER_THREADS = "(other threads)"
MAX_THREAD_NAMES = 100  # distinct thread.name values, besides the two buckets above
# Names CPython numbers per thread: Thread-N, Thread-N (target), Dummy-N, ThreadPoolExecutor-N_N.
_NUMBERED = re.compile(r"^(Thread|Dummy)-\d+(?= \(|$)|^(ThreadPoolExecutor)-\d+_\d+$")
_RATIO_BUCKETS = (0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0)  # upper bounds (le); then +Inf
_BUCKET_LABELS = tuple(str(b) for b in _RATIO_BUCKETS) + ("+Inf",)
MAX_ROUTES = 200
OTHER_ROUTES = "(other routes)"


def normalize(name: str) -> str:
    """``name`` without the per-thread number CPython put in it, if it is a default name."""
    return _NUMBERED.sub(lambda m: f"{m[1]}-N" if m[1] else f"{m[2]}-N_N", name)


def _reset(new: list[int], old: list[int]) -> bool:
    """A slot whose counters went down now belongs to another thread (tid reused)."""
    return any(n < o for n, o in zip(new, old))


class Totals:
    """Per-thread-name cumulative figures, kept monotonic across thread exits and tid reuse.

    Live threads are read from their slots. A thread that exits takes with it what it
    added since the last read; the header's exited totals have it (the BPF side frees
    the slot first and adds the exit after, the header is read before the slots, and
    only as of no exit half-added: so nothing is counted twice). It goes to that thread's
    name (a thread started and gone between two reads is known from ``started``), or to
    ``(exited threads)`` when the exits folded at once were of threads of several names,
    or unknown ones. The sum over names always equals the process's true total.
    """

    def __init__(self) -> None:
        self.by_name: dict[str, list[int]] = {}
        self._ring: Optional[ringlib.Ring] = None

    def _reset(self, ring: ringlib.Ring) -> None:
        self._ring = ring
        self._seen: dict[int, tuple[str, list[int]]] = {}  # tid -> (name, values last read)
        self._departed: collections.deque[tuple[str, list[int]]] = collections.deque()
        self._exited, self._exits = [0, 0, 0, 0], 0
        self._recent: dict[int, str] = {}  # the previous update's started threads
        self._unnamed: set[int] = set()  # tids whose slots the previous update left for later

    def _add(self, name: str, delta: list[int]) -> None:
        total = self.by_name.setdefault(name, [0, 0, 0, 0])
        for i, d in enumerate(delta):
            total[i] += d

    def _label(self, name: str) -> str:
        """The bounded ``thread.name`` a thread's figures go to."""
        name = normalize(name)
        if name in self.by_name or len(self.by_name) < MAX_THREAD_NAMES:
            return name
        return OTHER_THREADS

    def _name(self, tid: int, live: dict[int, threading.Thread], started: dict[int, str], fallback: bool) -> Optional[str]:
        """A thread's label: its ``threading`` name, or the one it started with (it left
        ``threading.enumerate()``: it is exiting). A thread that takes the GIL before
        ``threading`` knows its id (it is starting) gets None, unless ``fallback``: its
        kernel name, else its id."""
        thread = live.get(tid)
        name = thread.name if thread is not None else started.get(tid)
        if name is None and fallback:
            name = threads.name(tid, live) or str(tid)
        return None if name is None else self._label(name)

    def update(self, ring: ringlib.Ring, now_ns: int, started: Optional[dict[int, str]] = None) -> bool:
        """Read the ring; ``started``: threads started since the last update, by native id.
        False (nothing changed) if an exit was half-added or a slot stayed busy."""
        if not ring.continues(self._ring):  # a new registration: new slots, new exited totals
            self._reset(ring)
        self._ring = ring  # or the same slots, maybe through a new instrument()'s view: they go on
        exited_totals = _patiently(lambda: _exited(ring.header))
        slots = None if exited_totals is None else _patiently(lambda: _slots(ring))
        if slots is None:  # read again at the next collection, these starts with it
            self._recent = {**self._recent, **(started or {})}
            return False
        exited, exits = exited_totals
        # A start logged just before the previous read may belong to a thread first seen now.
        started, self._recent = {**self._recent, **(started or {})}, started or {}
        names = threads.live()
        live: dict[int, tuple[str, list[int]]] = {}
        unnamed: set[int] = set()
        for slot in slots:
            c = ringlib.counters(slot, now_ns)
            values = [c.wait_ns, c.hold_ns, c.acquisitions, c.convoy_waits]
            old = self._seen.pop(slot.tid, None)
            if old is not None and not _reset(values, old[1]):
                name, delta = old[0], [v - o for v, o in zip(values, old[1])]
            else:  # first sight, or the tid now belongs to a new thread
                if old is not None:
                    self._departed.append(old)
                name, delta = self._name(slot.tid, names, started, slot.tid in self._unnamed), values
                if name is None:  # starting: not yet in threading.enumerate(); named at the next read
                    unnamed.add(slot.tid)
                    continue
            self._add(name, delta)
            live[slot.tid] = (name, values)
        self._departed.extend(self._seen.values())  # not seen any more: exited
        self._seen, self._unnamed = live, unnamed
        folded = exits - self._exits
        gone = [self._departed.popleft() for _ in range(min(folded, len(self._departed)))]
        remainder = [max(e - p - sum(g[1][i] for g in gone), 0) for i, (e, p) in enumerate(zip(exited, self._exited))]
        if any(remainder):
            unseen = [self._label(n) for tid, n in started.items() if tid not in live and tid not in names]
            labels = {g[0] for g in gone} | set(unseen)
            known = folded - len(gone) <= len(unseen) and len(labels) == 1
            self._add(labels.pop() if known else EXITED_THREADS, remainder)
        self._exited, self._exits = exited, exits
        return True


def _exited(header: ringlib.Header) -> Optional[tuple[list[int], int]]:
    """The header's exited totals and count, as of no exit half-added: the BPF side bumps
    ``exits_started``, adds the totals, then bumps ``exited_threads``; equal counts read
    around the totals mean none was in between. None if every try met an exit in progress."""
    for _ in range(_HEADER_TRIES):
        exits = header.exited_threads
        exited = [getattr(header, f) for f in _EXITED]
        if header.exits_started == exits:
            return exited, exits
    return None


def _slots(ring: ringlib.Ring) -> Optional[list[ringlib.Slot]]:
    try:
        return list(ring.threads())
    except ringlib.BusySlot:
        return None


def _patiently(read: Callable[[], Optional[T]]) -> Optional[T]:
    """``read()`` until it gives an answer, for at most ``_PATIENCE_S`` (a writer preempted
    half-way through an update keeps it from answering meanwhile)."""
    deadline = time.monotonic() + _PATIENCE_S
    while True:
        answer = read()
        if answer is not None or time.monotonic() > deadline:
            return answer
        time.sleep(0.001)


class WaitRatios:
    """Server spans' wait ratios, counted per route into the buckets of ``_RATIO_BUCKETS``.

    ``table`` maps a route to its row: the count of each bucket (not cumulative),
    then the sum of the ratios. Routes beyond ``MAX_ROUTES`` are counted under
    ``(other routes)``, so the label set stays bounded whatever the app names its
    spans. ``counter(ratio, route)`` counts one span: in C where otel_gil._fastspan
    was built (the C span hooks call it directly), else :meth:`_count` under a lock.
    """

    def __init__(self, fast: bool = True) -> None:
        self.table: dict[str, list] = {}
        self._lock = threading.Lock()
        self.counter = self._count
        if fast:
            try:
                from otel_gil import _fastspan

                self.counter = _fastspan.RatioCounter(self.table, _RATIO_BUCKETS, MAX_ROUTES, OTHER_ROUTES)
            except (ImportError, AttributeError):  # not built, or built before the counter existed
                pass

    def _count(self, ratio: float, route: str) -> None:
        bucket = bisect.bisect_left(_RATIO_BUCKETS, ratio)
        with self._lock:
            row = self.table.get(route)
            if row is None:
                if len(self.table) >= MAX_ROUTES:
                    route = OTHER_ROUTES
                row = self.table.setdefault(route, [0] * len(_BUCKET_LABELS) + [0.0])
            row[bucket] += 1
            row[-1] += ratio

    def rows(self) -> list[tuple[str, list[int], int, float]]:
        """(route, cumulative bucket counts, count, sum) per route, consistent with each other."""
        with self._lock:  # a row is copied whole (list() does not release the GIL)
            snapshot = [(route, list(row)) for route, row in list(self.table.items())]
        out = []
        for route, row in snapshot:
            cumulative, total = [], 0
            for count in row[:-1]:
                total += count
                cumulative.append(total)
            out.append((route, cumulative, total, row[-1]))
        return out


GONE = "gone"  # the hold's location was overwritten (or never complete) when a span read it


class LocationMisses:
    """Counts of locations not read, by reason: the writers' (``header.location_misses``,
    kept monotonic across ring changes and fork resets) and the span hooks' (``gone``)."""

    def __init__(self) -> None:
        self.by_reason: dict[str, int] = {}
        self._ring: Optional[ringlib.Ring] = None
        self._last: list[int] = []
        self._lock = threading.Lock()

    def update(self, ring: ringlib.Ring) -> None:
        now = list(ring.header.location_misses)
        with self._lock:
            if not ring.continues(self._ring):
                self._last = [0] * len(now)  # a new ring: counted from its start
            self._ring = ring
            for reason, new, old in zip(ringlib.LOC_WHY_NAMES, now, self._last):
                if new > old:  # lower: the ring restarted (a fork child): counted from there
                    self.by_reason[reason] = self.by_reason.get(reason, 0) + new - old
            self._last = now

    def add(self, reason: str, count: int) -> None:
        with self._lock:
            self.by_reason[reason] = self.by_reason.get(reason, 0) + count


class GilMetrics:
    """Registers the instruments on ``meter``; reads the ring once per collection.

    One per meter for the process's life: the SDK keeps the first callbacks of an instrument
    name, so a new ``instrument()`` rebinds this to its backend (counters go on from their
    totals) instead of registering the instruments again.
    """

    def __init__(self, registration: Backend, meter: Meter, fast: bool = True) -> None:
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
        self.ratios = WaitRatios(fast)
        self._rows: list[tuple[str, list[int], int, float]] = []  # this collection's, from _observe_buckets
        meter.create_observable_counter(
            "gil.wait_ratio.bucket", [self._observe_buckets], unit="{span}",
            description="Server spans whose share of duration spent waiting for the GIL is at most le",
        )
        meter.create_observable_counter(
            "gil.wait_ratio.count", [self._observe_count], unit="{span}", description="Server spans measured"
        )
        meter.create_observable_counter(
            "gil.wait_ratio.sum", [self._observe_sum], unit="1", description="Sum of server spans' GIL wait ratios"
        )
        self._misses = LocationMisses()
        meter.create_observable_counter(
            "gil.location.misses", [self._observe_misses], unit="{hold}",
            description="Logged GIL holds whose code location could not be read, by reason",
        )
        self._dropped: dict[str, int] = {}
        meter.create_observable_counter(
            "gil.spans.dropped", [self._observe_dropped], unit="{span}",
            description="Spans whose GIL figures failed a consistency check and were left out (gil.status says why)",
        )
        if free_threading.free_threaded():
            meter.create_observable_gauge(
                GIL_ENABLED, [self._observe_gil_on], unit="1",
                description="1 once this free-threaded build runs with its GIL on, no point while it runs without "
                            "(gil.enabled_by: the module whose import turned it on)",
            )

    def rebind(self, registration: Backend) -> None:
        """Read ``registration``'s ring from now on (a new ``instrument()``)."""
        with self._lock:
            self._registration = registration

    def _refresh(self) -> None:
        with self._lock:
            state = self._registration.state
            if state.ring is not None and state.status == REGISTERED:
                self._totals.update(state.ring, time.monotonic_ns(), threads.take_starts())

    def _callback(self, index: int, scale: float):
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            if index == 0:  # a collection runs the callbacks in order: one read serves all four
                self._refresh()
            for name, values in list(self._totals.by_name.items()):
                value = values[index] * scale
                yield Observation(value if scale != 1 else int(value), {THREAD_NAME: name})

        return observe

    def _observe_buckets(self, options: CallbackOptions) -> Iterable[Observation]:
        self._rows = self.ratios.rows()  # the three callbacks of one collection report one snapshot
        for route, cumulative, _, _ in self._rows:
            for le, value in zip(_BUCKET_LABELS, cumulative):
                yield Observation(value, {HTTP_ROUTE: route, LE: le})

    def _observe_count(self, options: CallbackOptions) -> Iterable[Observation]:
        for route, _, count, _ in self._rows:
            yield Observation(count, {HTTP_ROUTE: route})

    def _observe_sum(self, options: CallbackOptions) -> Iterable[Observation]:
        for route, _, _, total in self._rows:
            yield Observation(total, {HTTP_ROUTE: route})

    def _observe_misses(self, options: CallbackOptions) -> Iterable[Observation]:
        state = self._registration.state
        if state.ring is not None and state.status == REGISTERED:
            self._misses.update(state.ring)
        for reason, value in self._misses.by_reason.items():
            yield Observation(value, {REASON: reason})

    def _observe_dropped(self, options: CallbackOptions) -> Iterable[Observation]:
        for reason, value in list(self._dropped.items()):
            yield Observation(value, {REASON: reason})

    def _observe_gil_on(self, options: CallbackOptions) -> Iterable[Observation]:
        registration = self._registration
        if not isinstance(registration, free_threading.UntilGilOn):
            return [Observation(1)]  # on from the start
        turned_on = registration.turned_on
        return [] if turned_on is None else [Observation(1, free_threading.enabled_by(turned_on))]

    def count_dropped(self, reason: str) -> None:
        """A span's figures left out (its ``gil.status``): they broke an invariant."""
        with self._lock:
            self._dropped[reason] = self._dropped.get(reason, 0) + 1

    def count_unlocated(self, waits: int) -> None:
        """Long waits on spans whose blocker's location was gone from the ring when the span ended."""
        if waits:
            self._misses.add(GONE, waits)

    def record_span(self, wait_ratio: float, route: str) -> None:
        self.ratios.counter(wait_ratio, route)

"""Trace the GIL of any running Python process from outside it, by pid (root).

The process needs no otel_gil and no restart: :class:`Attachment` loads the
collector's BPF program itself, gives the process a slot array and probes, and
:meth:`Attachment.poll` reads every thread's counters, long holds and long
waits. ``otel-gil report`` and ``otel-gil top`` are built on it.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from otel_gil import blame as blamelib
from otel_gil import protocol
from otel_gil import ring as ringlib
from otel_gil_collector import threadnames
from otel_gil_collector.pyprocess import Unreadable

LONG_NS = 1_000_000  # a hold or wait this long is drawn and listed one by one
NAMES_EVERY_NS = 500_000_000


class AttachError(Exception):
    """Why a process cannot be attached to; the message says what to do."""


@dataclass
class ThreadTrace:
    """One thread, as seen so far: latest counters, and its long holds and waits."""

    tid: int  # in the process's own pid namespace
    name: str = "?"
    counters: ringlib.Counters = ringlib.ZERO
    hist: tuple[int, ...] = (0,) * ringlib.HIST_BUCKETS
    holds: list[tuple[int, int]] = field(default_factory=list)  # (start_ns, end_ns)
    waits: list[ringlib.Wait] = field(default_factory=list)
    lost: int = 0  # long holds/waits overwritten in the ring before they were read
    # free-threaded, GIL off: ns parked by ring.PARK_*, and by critical sections' object type
    parked: tuple[int, ...] = (0,) * ringlib.PARK_KINDS
    parked_types: dict[str, int] = field(default_factory=dict)
    parks: int = 0
    _seen_holds: int = 0
    _seen_waits: int = 0


@dataclass
class _Parked:
    """One thread's parks added up: ns by ring.PARK_*, ns by critical sections' object type, parks."""

    by_kind: list[int] = field(default_factory=lambda: [0] * ringlib.PARK_KINDS)
    types: dict[str, int] = field(default_factory=dict)
    parks: int = 0

    def add(self, kind: tuple[int, str], ns: int, parks: int) -> None:
        self.by_kind[kind[0]] += ns
        self.parks += parks
        if kind[0] == ringlib.PARK_OBJECT:
            self.types[kind[1]] = self.types.get(kind[1], 0) + ns


def proc_thread_names(pid: int) -> dict[int, str]:
    """Thread id (in the process's own pid namespace) -> name, from /proc (the OS's names:
    CPython sets them from ``threading`` only from 3.14, cut at 15 characters)."""
    names: dict[int, str] = {}
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return names  # the process is gone
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/status") as f:
                status = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
            names[int(status.get("NSpid", task).split()[-1])] = status.get("Name", "").strip()
        except (OSError, ValueError):
            continue
    return names


class Attachment:
    """The collector's probes on one process, for as long as the attachment is open."""

    def __init__(self, pid: int, command: str, progress: Callable[[str], None] = print) -> None:
        """On a free-threaded build running without its GIL, times its parks instead
        (``gil_disabled`` says why there are no GIL figures; :meth:`poll` fills ThreadTrace.parked)."""
        from otel_gil_collector import parkkinds, probes, pyprocess
        from otel_gil_collector.__main__ import PreflightError, _check_kernel, _check_privileges, _import_bcc

        try:
            _check_privileges()
        except PreflightError:
            raise AttachError(f"{command} needs root (or CAP_SYS_ADMIN): run it with sudo") from None
        try:
            _import_bcc()
            _check_kernel()
        except PreflightError as exc:
            raise AttachError(str(exc.code)) from None
        if not os.path.exists(f"/proc/{pid}"):
            raise AttachError(f"no process {pid}")
        self.gil_disabled = ""  # why there are no GIL figures, parked time instead
        self._kinds: Optional[parkkinds.Classifier] = None
        try:
            found = probes.interpreter(pid)
            # In this order: a build whose GIL is on (PYTHON_GIL=1, or an import turned it on) has
            # GIL figures, whether or not its parks could be timed.
            if found.free_threaded and not pyprocess.gil_enabled(pid, found.maps, found.mapping.path, found.info):
                self.gil_disabled = f"{protocol.GIL_DISABLED}: {probes.without_gil(found.mapping)}"
                self.plan = probes.plan_parks(pid, found)
                self._kinds = parkkinds.Classifier(pid, found.maps, found.mapping.path, found.info)
            else:
                self.plan = probes.plan(pid, found=found)
        except probes.UnsupportedProcess as exc:
            raise AttachError(f"{self.gil_disabled}; no parked time either: {exc}" if self.gil_disabled
                              else str(exc)) from None
        except Unreadable as why:
            raise AttachError(f"{protocol.GIL_DISABLED}: {probes.without_gil(found.mapping)}; "
                              f"no parked time either: {why}") from None
        from otel_gil_collector.tracer import Tracer

        progress("compiling and loading the BPF program (a few seconds)...")
        self.pid = pid
        self._tracer = Tracer(2048, 1, parks=self._kinds is not None)
        try:
            self._traced = self._tracer.add(pid, self.plan, LONG_NS, int(sys.getswitchinterval() * 1e9))
        except BaseException:
            self._tracer.close()
            raise
        self.start_ns = time.monotonic_ns()
        self.threads: dict[int, ThreadTrace] = {}
        self.present: set[int] = set()  # threads with a slot at the last poll
        self.holds: list[ringlib.Hold] = []  # the process's hold log, as read so far
        self.locations: dict[int, Optional[ringlib.Location]] = {}  # hold index -> its location, read with it
        self._unlocated: list[int] = []  # holds of the last poll whose location was not there: read again once
        self.holds_lost = 0  # polls that found older holds already overwritten
        self._park_totals: dict[tuple[int, int], tuple[int, int]] = {}  # (tid, address) -> (ns, parks) read
        self._closed: dict[int, _Parked] = {}  # tid -> its closed parks, added up from those totals
        self._names_at = 0
        self.names_from = "threading"  # or why /proc's names are shown instead
        self._progress = progress
        found = "_PyParkingLot_Park" if self._kinds else "take_gil"
        progress(f"attached to pid {pid} ({self.plan.interpreter}, {found} found by {self.plan.located_by})")

    def __enter__(self) -> "Attachment":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._tracer.close()

    @property
    def alive(self) -> bool:
        return os.path.exists(f"/proc/{self.pid}")

    @property
    def header(self) -> ringlib.Header:
        return self._traced.view.header

    @property
    def located(self) -> bool:
        """Whether the GIL's condition variables are learned: no figure means anything before."""
        return self._traced.learned

    def not_located(self) -> str:
        return (f"gil_not_located: no GIL hand-off of pid {self.pid} was seen through the probes "
                f"({', '.join(sorted({p.path for p in self.plan.probes}))}), so there are no figures")

    def thread_names(self) -> dict[int, str]:
        """Thread id -> name as ``threading`` has it (read from the process's memory); threads
        it does not know, and every thread if the memory cannot be read, by /proc's name."""
        names = proc_thread_names(self.pid)
        try:
            names.update(threadnames.read(self.pid, self.plan.interpreter, self.plan.interpreter_file))
            self.names_from = "threading"
        except threadnames.Unreadable as exc:
            if self.names_from == "threading":
                self._progress(f"thread names from /proc: threading's are unreadable ({exc})")
            self.names_from = f"/proc (threading's are unreadable: {exc})"
        return names

    def poll(self) -> int:
        """Read every thread's slot now; returns the time read (CLOCK_MONOTONIC ns)."""
        self._tracer.finish_bootstrap()
        now = time.monotonic_ns()
        present, fresh = set(), False  # fresh: a thread first seen, named now (it may not live long)
        slots = list(self._traced.view.threads())
        for slot in slots:
            fresh |= slot.tid not in self.threads
            t = self.threads.setdefault(slot.tid, ThreadTrace(slot.tid))
            counters = ringlib.counters(slot, now)
            if counters.acquisitions < t.counters.acquisitions:  # the tid was reused by a new thread
                t._seen_holds = t._seen_waits = 0
                t.name, fresh = "?", True
            t.counters, t.hist = counters, tuple(slot.hist)
            holds, lost_h = ringlib.long_holds_since(slot, t._seen_holds)
            waits, lost_w = ringlib.long_waits_since(slot, t._seen_waits)
            t.holds += holds
            t.waits += waits
            t.lost += lost_h + lost_w
            t._seen_holds, t._seen_waits = slot.long_holds, slot.long_waits
            present.add(slot.tid)
        self.present = present
        if self._kinds is not None:
            self._parked(now, slots)
        # A hold is published before its location is written (gil_writer.h): one read between
        # the two finds none, so those are read again at the next poll.
        for index in self._unlocated:
            if index in self.locations:
                self.locations[index] = self._traced.view.location(index)
        new, complete = self._traced.view.holds_since(self.holds[-1].end_ns if self.holds else 0)
        self.holds += new
        self.holds_lost += not complete and bool(self.holds)
        for h in new:  # read now: the location log keeps fewer entries than the hold log
            self.locations[h.index] = self._traced.view.location(h.index)
            fresh |= h.tid not in self.threads
        self._unlocated = [h.index for h in new if self.locations[h.index] is None]
        if fresh or now - self._names_at > NAMES_EVERY_NS:
            for tid, name in self.thread_names().items():
                self.threads.setdefault(tid, ThreadTrace(tid)).name = name
            self._names_at = now
        return now

    def _parked(self, now: int, slots: list[ringlib.Slot]) -> None:
        """Each thread's parked time by kind so far: its closed parks, added up per poll from the
        addresses whose totals grew since the last (each address's kind read now: its memory may
        hold another object by the next), and its open park at ``now`` (``slots``, read before
        the totals: one that closed since is in its address's total already); closed parks the
        BPF map had no room for are other."""
        grown = [(key, total) for key, total in self._tracer.parks_by_address(self.pid)
                 if total != self._park_totals.get(key)]
        open_at = {s.park_addr for s in slots if s.park_start_ns}
        kinds = self._kinds.kinds_of({addr for (_, addr), _ in grown} | open_at) if grown or open_at else {}
        for (tid, addr), (ns, parks) in grown:
            was_ns, was_parks = self._park_totals.get((tid, addr), (0, 0))
            self._park_totals[tid, addr] = ns, parks
            self._closed.setdefault(tid, _Parked()).add(kinds[addr], ns - was_ns, parks - was_parks)
        for tid, closed in self._closed.items():
            self._show(tid, closed)
        for s in slots:
            closed = self._closed.get(s.tid, _Parked())
            now_parked = _Parked(list(closed.by_kind), dict(closed.types), closed.parks)
            if s.parks > closed.parks:
                now_parked.add((ringlib.PARK_OTHER, ""), max(sum(s.parked_ns) - sum(closed.by_kind), 0),
                               s.parks - closed.parks)
            if s.park_start_ns and now_parked.parks == s.parks:
                now_parked.add(kinds[s.park_addr], max(now - s.park_start_ns, 0), 0)
            self._show(s.tid, now_parked)

    def _show(self, tid: int, parked: "_Parked") -> None:
        t = self.threads.setdefault(tid, ThreadTrace(tid))
        t.parked, t.parked_types, t.parks = tuple(parked.by_kind), dict(parked.types), parked.parks

    def forget(self, before_ns: int) -> None:
        """Drop the long holds and waits that ended before ``before_ns``, and the holds no kept
        wait needs (a live view keeps only what it shows)."""
        cutoff = before_ns
        for t in self.threads.values():
            t.holds = [h for h in t.holds if h[1] >= before_ns]
            t.waits = [w for w in t.waits if w.end_ns >= before_ns]
            cutoff = min([cutoff, *(w.start_ns for w in t.waits)])
        kept = [h for h in self.holds if h.end_ns >= cutoff]
        for h in self.holds[:len(self.holds) - len(kept)]:
            self.locations.pop(h.index, None)
        self.holds = kept

    def waited_on(self, tid: int, since_ns: int = 0) -> list[tuple[int, int]]:
        """(blocker tid, ns) for the long waits of ``tid`` that ended after ``since_ns``: which
        threads held the GIL while it waited, by time held, most first."""
        log = blamelib.HoldLog(self.holds)
        total: dict[int, int] = {}
        for w in self.threads[tid].waits:
            if w.end_ns > since_ns:
                for blocker, ns in log.blame(w).held_by:
                    total[blocker] = total.get(blocker, 0) + ns
        return sorted(total.items(), key=lambda item: item[1], reverse=True)

"""Blame by time held: which threads held the GIL during a long wait, and for how long.

A long wait's length splits into the time each thread held the GIL meanwhile (from
the process's hold log: holds of at least ``header.hold_record_ns``), the time held
in holds too short to be logged (or no longer in the log), and the hand-off: the
GIL was free while the waiter was being woken. The writer measures the held total
of each wait (``Wait.held_ns``) independently of the log, so the parts are checked
against each other, not derived from one another.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from typing import Callable, Optional

from otel_gil import ring as ringlib
from otel_gil.semconv import (BLOCKER, BLOCKER_CODE_STACKTRACE, BLOCKER_HOLD_MS, BLOCKER_SPAN_ID, BLOCKER_SPAN_NAME,
                              BLOCKER_THREAD, BLOCKERS_HOLD_MS, BLOCKERS_OTHERS_MS, BLOCKERS_THREAD_NAME,
                              BLOCKERS_THREAD_NATIVE_ID, BLOCKERS_UNRECORDED_MS, GIL_HANDOFF_MS, GIL_WAIT_FORCED_SWITCH,
                              GIL_WAIT_MS)

LISTED = 4  # holders named on a gil.wait event, most held first
# (thread.id, name) of the thread that had a kernel tid from one time to another (CLOCK_MONOTONIC
# ns), each None where not known: ``otel_gil.threads.owner``
Who = Callable[[int, int, int], tuple[Optional[int], Optional[str]]]


@dataclass(frozen=True)
class Blame:
    """One long wait, broken down by who held the GIL."""

    wait: ringlib.Wait
    held_by: list[tuple[int, int]]  # (tid, ns held during the wait), most first
    unrecorded_ns: int  # held in holds too short for the log (or overwritten in it)
    handoff_ns: int  # the GIL was free: the waiter was being woken
    # Where the longest holder was when it released the GIL at the end of its hold that
    # overlapped the wait most; None if no hold was logged or its location is gone from the ring.
    location: Optional[ringlib.Location] = None
    # That hold (None if none was logged): on a thread whose contexts switch, whose code ran in it.
    hold: Optional[ringlib.Hold] = None

    @property
    def blocker(self) -> tuple[int, int]:
        """(tid, ns) of the thread that held the GIL longest; the last releaser if none was logged."""
        return self.held_by[0] if self.held_by else (self.wait.blocker_tid, 0)


class HoldLog:
    """Holds of the process's hold log, in log order, to blame several waits on."""

    def __init__(self, holds: list[ringlib.Hold], ring: Optional[ringlib.Ring] = None) -> None:
        self.holds = holds
        self._ends = [h.end_ns for h in holds]
        self._ring = ring  # where the holds' locations are read (none without it)

    @classmethod
    def read(cls, ring: ringlib.Ring, since_ns: int) -> "HoldLog":
        """The holds of ``ring`` that ended after ``since_ns``."""
        return cls(ring.holds_since(since_ns)[0], ring)

    def blame(self, wait: ringlib.Wait) -> Blame:
        held = ringlib.held_during(self.holds, self._ends, wait.start_ns, wait.end_ns)
        by_time = sorted(held.items(), key=lambda item: item[1], reverse=True)
        length = wait.end_ns - wait.start_ns
        hold = self._longest_hold(by_time[0][0], wait) if by_time else None
        location = self._ring.location(hold.index) if hold is not None and self._ring is not None else None
        return Blame(wait, by_time, max(wait.held_ns - sum(held.values()), 0), length - wait.held_ns, location, hold)

    def _longest_hold(self, tid: int, wait: ringlib.Wait) -> Optional[ringlib.Hold]:
        """``tid``'s hold that overlapped ``wait`` most."""
        best, most = None, 0
        for i in range(bisect_right(self._ends, wait.start_ns), len(self.holds)):
            h = self.holds[i]
            if h.start_ns >= wait.end_ns:
                break
            overlap = min(h.end_ns, wait.end_ns) - max(h.start_ns, wait.start_ns)
            if h.tid == tid and overlap > most:
                best, most = h, overlap
        return best


def _ms(ns: int) -> float:
    return round(ns / 1e6, 3)


def thread_attributes(prefix: str, tid: int, who: Who, start_ns: int, end_ns: int) -> dict:
    """A thread named by kernel tid: ``{prefix}.native_id``, and where ``who`` knows them for
    the thread that had ``tid`` from ``start_ns`` to ``end_ns``, ``{prefix}.id``, the managed
    id its own spans and logs carry, and ``{prefix}.name``."""
    ident, name = who(tid, start_ns, end_ns)
    attrs: dict = {f"{prefix}.native_id": tid}
    if ident is not None:
        attrs[f"{prefix}.id"] = ident
    if name is not None:
        attrs[f"{prefix}.name"] = name
    return attrs


def event_attributes(b: Blame, who: Who, span_of=None) -> dict:
    """The ``gil.wait`` event of a long wait; ``who`` names its blockers, ``span_of(tid, start_ns,
    end_ns)`` gives the (name, span id) of the span whose code held the GIL on that thread within
    its longest hold during the wait, or None."""
    tid, held = b.blocker
    start, end = b.wait.start_ns, b.wait.end_ns
    attrs: dict = {GIL_WAIT_MS: _ms(end - start), **thread_attributes(BLOCKER_THREAD, tid, who, start, end)}
    during = (b.wait.start_ns, b.wait.end_ns) if b.hold is None else (
        max(b.hold.start_ns, b.wait.start_ns), min(b.hold.end_ns, b.wait.end_ns))
    span = span_of(tid, *during) if span_of is not None and b.held_by else None
    if span is not None:
        attrs[BLOCKER_SPAN_NAME], attrs[BLOCKER_SPAN_ID] = span
    if b.held_by:
        listed = b.held_by[:LISTED]
        attrs[BLOCKER_HOLD_MS] = _ms(held)
        attrs[BLOCKERS_THREAD_NATIVE_ID] = [t for t, _ in listed]
        attrs[BLOCKERS_THREAD_NAME] = [who(t, start, end)[1] or str(t) for t, _ in listed]
        attrs[BLOCKERS_HOLD_MS] = [_ms(ns) for _, ns in listed]
        attrs[BLOCKERS_OTHERS_MS] = _ms(sum(ns for _, ns in b.held_by[LISTED:]))
        attrs.update(code_attributes(BLOCKER, b.location))
        if b.location is not None and b.location.frames:
            attrs[BLOCKER_CODE_STACKTRACE] = stacktrace(b.location)
    attrs[BLOCKERS_UNRECORDED_MS] = _ms(b.unrecorded_ns)
    attrs[GIL_HANDOFF_MS] = _ms(b.handoff_ns)
    if b.wait.forced:
        attrs[GIL_WAIT_FORCED_SWITCH] = True
    return attrs


def top_blocker(blames: list[Blame]) -> Optional[tuple[int, int, int, int]]:
    """(tid, ns) of the thread that held the GIL longest over all these waits, and from when to
    when it did (the start of the first and the end of the last wait it held it in: CLOCK_MONOTONIC
    ns); None if none was logged."""
    total: dict[int, int] = {}
    during: dict[int, tuple[int, int]] = {}
    for b in blames:
        for tid, ns in b.held_by:
            total[tid] = total.get(tid, 0) + ns
            first, last = during.get(tid, (b.wait.start_ns, b.wait.end_ns))
            during[tid] = (min(first, b.wait.start_ns), max(last, b.wait.end_ns))
    if not total:
        return None
    tid = max(total, key=total.__getitem__)
    return (tid, total[tid], *during[tid])


def code_attributes(prefix: str, location: Optional[ringlib.Location]) -> dict:
    """The ``code.*`` attributes (OpenTelemetry semantic conventions) of a location's innermost
    frame, under ``prefix``; none for what was not read (never an empty name or a line 0)."""
    if location is None or not location.frames:
        return {}
    frame = location.frames[0]
    attrs = {f"{prefix}.code.function.name": frame.function, f"{prefix}.code.file.path": frame.file}
    if frame.line:
        attrs[f"{prefix}.code.line.number"] = frame.line
    return attrs


def stacktrace(location: ringlib.Location) -> str:
    """A location's frames, innermost first, one a line: ``function (file:line)`` (``?``: line unknown)."""
    return "\n".join(f"{f.function} ({f.file}:{f.line or '?'})" for f in location.frames)


def top_location(blames: list[Blame], tid: int) -> Optional[ringlib.Location]:
    """Where thread ``tid`` was at the end of the holds that blocked these waits longest, by
    innermost frame (summed over the waits it blocked most); None if none was read."""
    held: dict[ringlib.Frame, int] = {}
    found: dict[ringlib.Frame, ringlib.Location] = {}
    for b in blames:
        if b.held_by and b.held_by[0][0] == tid and b.location is not None and b.location.frames:
            frame = b.location.frames[0]
            held[frame] = held.get(frame, 0) + b.held_by[0][1]
            found.setdefault(frame, b.location)
    return found[max(held, key=held.__getitem__)] if held else None


def unlocated(blames: list[Blame]) -> int:
    """Waits whose longest holder's hold was logged but whose location was gone from the ring
    (a location the writer could not take has no frames: counted by the writer, by why)."""
    return sum(1 for b in blames if b.held_by and b.location is None)

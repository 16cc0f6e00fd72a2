"""Hold time by function: where the GIL's holders were when they released it.

Every hold of at least ``hold_record_ns`` (0.1 ms) goes into the process's hold log with
its holder's code location at the release (``struct gil_location``): summing the logged
holds by their innermost frame is an exact profile of who held the GIL where, not a
sampled one. What it cannot cover is said with it: the holds too short to be logged (their
share of the hold time), and the logged holds whose location was not read, by why.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

from otel_gil import ring as ringlib

GONE = "gone"  # the location was overwritten before it was read


@dataclass
class Function:
    """One place the GIL was released from, and the holds that ended there."""

    function: str
    file: str
    line: Optional[int]
    hold_ns: int = 0
    holds: int = 0
    longest_ns: int = 0
    tids: set[int] = field(default_factory=set)

    def where(self, basename: bool = False) -> str:
        """``function (file:line)``, the file's directory left out if ``basename``."""
        file = os.path.basename(self.file) if basename else self.file
        return f"{self.function} ({file}:{self.line or '?'})"


@dataclass
class Profile:
    """Logged hold time by function, most first, and what was logged without a location."""

    functions: list[Function]
    unlocated_ns: dict[str, int]  # why -> hold ns
    logged_ns: int  # all the logged holds' time in the window


def profile(holds: list[ringlib.Hold], locations: dict[int, Optional[ringlib.Location]],
            since_ns: int = 0, until_ns: Optional[int] = None) -> Profile:
    """The holds' time within [since_ns, until_ns) by their location's innermost frame
    (``locations``: hold index -> location read, None if it was gone)."""
    by_place: dict[ringlib.Frame, Function] = {}
    unlocated: dict[str, int] = {}
    logged = 0
    for h in holds:
        ns = min(h.end_ns, until_ns or h.end_ns) - max(h.start_ns, since_ns)
        if ns <= 0:
            continue
        logged += ns
        location = locations.get(h.index)
        if location is None or not location.frames:
            why = GONE if location is None else (location.missing[0] if location.missing else "no_frame")
            unlocated[why] = unlocated.get(why, 0) + ns
            continue
        frame = location.frames[0]
        f = by_place.get(frame)
        if f is None:
            f = by_place[frame] = Function(frame.function, frame.file, frame.line)
        f.hold_ns += ns
        f.holds += 1
        f.longest_ns = max(f.longest_ns, h.end_ns - h.start_ns)
        f.tids.add(h.tid)
    return Profile(sorted(by_place.values(), key=lambda f: f.hold_ns, reverse=True), unlocated, logged)

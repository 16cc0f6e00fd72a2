"""``otel-gil top --pid PID``: a live per-thread view of who holds and who waits for the GIL,
and in which functions it was held.

On a free-threaded build running without its GIL it shows, per thread, the time parked in
CPython's parking lot by what it parked on instead (as ``otel-gil report``). Refreshes every
interval with the figures of that interval only. In a terminal it
is a full-screen view (curses: works over ssh) that quits on ``q`` or Ctrl-C;
with ``--batch``, or when stdout is not a terminal, it prints one frame per
interval instead.
"""

from __future__ import annotations

import curses
import time

from otel_gil import ring as ringlib
from otel_gil_collector import functions
from otel_gil_collector.attach import Attachment
from otel_gil.semconv import PARK_KINDS
from otel_gil_collector.report import PARKED_HEADER, PARKED_LEGEND, fmt_ns, gil_disabled_line, parked_line

KEY_POLL_S = 0.05
FUNCTIONS = 5  # places shown, most held first


class Frames:
    """Turns successive polls of an attachment into per-interval tables."""

    def __init__(self, att: Attachment) -> None:
        self.att = att
        self._t = att.poll()
        self._prev = {tid: t.counters for tid, t in att.threads.items()}
        self._parked_prev = {tid: (t.parked, dict(t.parked_types), t.parks) for tid, t in att.threads.items()}

    def next(self) -> list[str]:
        now = self.att.poll()
        dt = max(now - self._t, 1)
        if self.att.gil_disabled:
            self._t = now
            return self._parked(dt)
        rows = []
        for tid in self.att.present:
            t = self.att.threads[tid]
            before = self._prev.get(tid, ringlib.ZERO)
            hold, wait = t.counters.hold_ns - before.hold_ns, t.counters.wait_ns - before.wait_ns
            acq, convoy = t.counters.acquisitions - before.acquisitions, t.counters.convoy_waits - before.convoy_waits
            if hold >= 0 and wait >= 0:  # negative: the tid was reused by a new thread this interval
                rows.append((hold, wait, tid, t.name, acq, convoy))
        self._prev = {tid: t.counters for tid, t in self.att.threads.items()}
        waited_on = {tid: self.att.waited_on(tid, self._t) for tid in self.att.present}
        by_function = functions.profile(self.att.holds, self.att.locations, self._t, now)
        self.att.forget(self._t)
        self._t = now
        rows.sort(reverse=True)  # by hold: the holders are the cause
        held, waited = sum(r[0] for r in rows), sum(r[1] for r in rows)
        if not self.att.located:
            return [f"otel-gil top: pid {self.att.pid}: {self.att.not_located()} yet"]
        lines = [
            f"otel-gil top: pid {self.att.pid}, last {dt / 1e9:.1f} s: GIL held {100 * held / dt:.0f} %, "
            f"waited {100 * waited / dt:.0f} % (summed over threads)",
            self.att.plan.interpreter,
            *([] if self.att.names_from == "threading" else [f"thread names from {self.att.names_from}"]),
            "",
            f"{'tid':>8} {'thread':<19} {'hold %':>7} {'wait %':>7} {'held':>8} {'waited':>8} {'acq/s':>8} {'convoy':>7}",
        ]
        for hold, wait, tid, name, acq, convoy in rows:
            lines.append(
                f"{tid:>8} {name[:19]:<19} {100 * hold / dt:>6.1f}% {100 * wait / dt:>6.1f}% {fmt_ns(hold):>8} "
                f"{fmt_ns(wait):>8} {acq * 1e9 / dt:>8.0f} {convoy:>7}"
            )
        blamed = sorted((r for r in rows if waited_on.get(r[2])), key=lambda r: r[1], reverse=True)
        if blamed:
            lines += ["", "waited on (who held the GIL during each thread's long waits):"]
            for _, _, tid, name, _, _ in blamed:
                on = ", ".join(f"{self._name(b)} ({b}) {fmt_ns(ns)}" for b, ns in waited_on[tid][:3])
                lines.append(f"{tid:>8} {name[:19]:<19} {on}")
        if by_function.functions:
            lines += ["", "held by function (where holds of 0.1 ms or more ended):"]
            for f in by_function.functions[:FUNCTIONS]:
                threads = ", ".join(sorted(self._name(t) for t in f.tids))
                where = f.where(basename=True)  # report has the paths
                lines.append(f"{100 * f.hold_ns / dt:>7.1f}% {fmt_ns(f.hold_ns):>8}  {threads[:19]:<19} {where}")
        return lines

    def _parked(self, dt: int) -> list[str]:
        """The frame of a free-threaded process without its GIL: each thread's parked time by
        kind this interval."""
        rows = []
        for tid in self.att.present:
            t = self.att.threads[tid]
            parked, types, parks = self._parked_prev.get(tid, ((0,) * len(PARK_KINDS), {}, 0))
            # max(): a park seen open, then closed where the map had no room, moves to other
            by_kind = {k: max(now - before, 0) / 1e9 for k, now, before in zip(PARK_KINDS, t.parked, parked)}
            on = {name: (ns - types.get(name, 0)) / 1e9 for name, ns in t.parked_types.items() if ns > types.get(name, 0)}
            rows.append((tid, t.name, by_kind, max(t.parks - parks, 0), dict(sorted(on.items(), key=lambda i: -i[1]))))
        self._parked_prev = {tid: (t.parked, dict(t.parked_types), t.parks) for tid, t in self.att.threads.items()}
        rows.sort(key=lambda r: sum(r[2].values()), reverse=True)
        total = sum(sum(r[2].values()) for r in rows) * 1e9
        return [f"otel-gil top: pid {self.att.pid}, last {dt / 1e9:.1f} s: {gil_disabled_line(self.att.gil_disabled)}",
                f"parked {100 * total / dt:.0f} % of the time (summed over threads)", self.att.plan.interpreter,
                *([] if self.att.names_from == "threading" else [f"thread names from {self.att.names_from}"]),
                "", PARKED_HEADER, *(parked_line(*row) for row in rows), "", PARKED_LEGEND]

    def _name(self, tid: int) -> str:
        t = self.att.threads.get(tid)
        return t.name if t is not None else str(tid)


def batch(att: Attachment, interval: float, count: int | None) -> None:
    """Print a frame every ``interval`` s, ``count`` times (forever if None) or until the process exits."""
    frames = Frames(att)
    n = 0
    while count is None or n < count:
        time.sleep(interval)
        if not att.alive:
            print(f"pid {att.pid} exited")
            return
        print("\n".join(frames.next()) + "\n", flush=True)
        n += 1


def live(att: Attachment, interval: float) -> None:
    """Full-screen view until q, Ctrl-C or the process's exit."""
    curses.wrapper(_live, att, interval)


def _live(screen, att: Attachment, interval: float) -> None:
    curses.curs_set(0)
    screen.timeout(int(KEY_POLL_S * 1000))
    frames = Frames(att)
    lines = ["attached; the first figures come after one interval", "", "q quits"]
    due = time.monotonic() + interval
    while True:
        if time.monotonic() >= due:
            if not att.alive:
                return
            lines = frames.next() + ["", "q quits"]
            due += interval
        height, width = screen.getmaxyx()
        screen.erase()
        for y, line in enumerate(lines[:height]):
            screen.addnstr(y, 0, line, width - 1)
        screen.refresh()
        if screen.getch() in (ord("q"), ord("Q")):
            return

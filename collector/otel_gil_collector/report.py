"""``otel-gil report``: per-thread GIL figures of any running Python process, by pid.

Needs root and bcc (see :mod:`otel_gil_collector.attach`; the process needs no otel_gil and
no restart). The figures are those of the capture window only.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from otel_gil import ring as ringlib
from otel_gil.semconv import PARK_KINDS
from otel_gil_collector import functions
from otel_gil_collector.attach import AttachError, Attachment, ThreadTrace

POLL_S = 0.01  # ring reads: often enough that no thread's 16 long holds/waits overflow
SAMPLES = 1000  # at most this many hold/wait samples per thread for the timeline
QUANTILES = (0.5, 0.9, 0.99)
WAITED_ON = 3  # blockers listed per thread
FUNCTIONS = 15  # places listed in the text report (the JSON has them all)


@dataclass
class Capture:
    """What a capture saw: the report, and per-thread traces and samples for the timeline."""

    report: dict
    traces: dict[int, ThreadTrace]
    # (time ns, {tid: (hold ns, wait ns) so far}), at most SAMPLES of them
    samples: list[tuple[int, dict[int, tuple[int, int]]]] = field(default_factory=list)
    holds: list[ringlib.Hold] = field(default_factory=list)  # the process's hold log, as read
    locations: dict[int, Optional[ringlib.Location]] = field(default_factory=dict)  # hold index -> location


def _pct(part: float, whole: float) -> float:
    return round(100 * part / whole, 2) if whole else 0.0


def _thread(t: ThreadTrace, wall_s: float) -> dict:
    c = t.counters
    row = {
        "tid": t.tid, "name": t.name,
        "wait_s": c.wait_ns / 1e9, "hold_s": c.hold_ns / 1e9, "acquisitions": c.acquisitions,
        "convoy_waits": c.convoy_waits, "long_waits": len(t.waits), "long_holds": len(t.holds),
        "wait_pct": _pct(c.wait_ns / 1e9, wall_s), "hold_pct": _pct(c.hold_ns / 1e9, wall_s),
    }
    for q in QUANTILES:  # upper bounds of the histogram's power-of-two buckets
        row[f"wait_p{round(q * 100)}_s"] = ringlib.hist_quantile(t.hist, q) / 1e9
    return row


def capture(pid: int, duration_s: float, progress: Callable[[str], None] = print) -> Capture:
    """Attach to ``pid`` for ``duration_s`` (less if it exits) and return what was seen."""
    with Attachment(pid, "otel-gil report", progress) as att:
        progress(f"capturing {duration_s:g} s...")
        sample_every = max(int(duration_s * 1e9 / SAMPLES), int(POLL_S * 1e9))
        samples: list[tuple[int, dict[int, tuple[int, int]]]] = []
        deadline = att.start_ns + int(duration_s * 1e9)
        end = att.start_ns
        countdown, shown = sys.stderr.isatty(), 0  # seconds captured, shown on a terminal
        while end < deadline and att.alive:
            time.sleep(min(POLL_S, max(deadline - time.monotonic_ns(), 0) / 1e9))
            end = att.poll()
            if not samples or end - samples[-1][0] >= sample_every:
                samples.append((end, {tid: (t.counters.hold_ns, t.counters.wait_ns) for tid, t in att.threads.items()}))
            if countdown and (end - att.start_ns) // 10**9 > shown:
                shown = (end - att.start_ns) // 10**9
                print(f"\r{shown}/{duration_s:g} s", end="", file=sys.stderr, flush=True)
        if shown:
            print(file=sys.stderr)
        if not att.alive:
            progress(f"pid {pid} exited during the capture: reporting up to its exit")
        if att.gil_disabled:
            return Capture(_parked_report(att, end), att.threads)
        if not att.located:
            raise AttachError(att.not_located())
        header = att.header
        exited = {"threads": header.exited_threads, "wait_s": header.exited_wait_ns / 1e9,
                  "hold_s": header.exited_hold_ns / 1e9}
        threads, interpreter, start, names_from = att.threads, att.plan.interpreter, att.start_ns, att.names_from
        present = att.present
        waited_on = {tid: att.waited_on(tid) for tid in present}
        holds, locations = att.holds, att.locations
    wall = (end - start) / 1e9
    rows = [_thread(threads[tid], wall) for tid in present]
    for row in rows:
        row["waited_on"] = [{"tid": b, "name": threads[b].name if b in threads else "?", "s": ns / 1e9}
                            for b, ns in waited_on[row["tid"]][:WAITED_ON]]
    rows.sort(key=lambda r: (r["hold_s"], r["wait_s"]), reverse=True)  # the holders are the cause
    total_wait = sum(r["wait_s"] for r in rows) + exited["wait_s"]
    total_hold = sum(r["hold_s"] for r in rows) + exited["hold_s"]
    hist = [sum(threads[tid].hist[b] for tid in present) for b in range(ringlib.HIST_BUCKETS)]
    report = {
        "pid": pid,
        "duration_s": round(wall, 6),
        "start_ns": start,  # CLOCK_MONOTONIC, as the process's time.monotonic_ns()
        "interpreter": interpreter,
        "thread_names": names_from,  # "threading", or why the names are /proc's
        "hold_pct": _pct(total_hold, wall),
        "wait_pct": _pct(total_wait, wall),
        **{f"wait_p{round(q * 100)}_s": ringlib.hist_quantile(hist, q) / 1e9 for q in QUANTILES},
        "threads": rows,
        "exited_threads": exited,
        "functions": _functions(functions.profile(holds, locations, start, end), total_hold, wall, threads),
    }
    return Capture(report, threads, samples, holds, locations)


def _parked_report(att: Attachment, end: int) -> dict:
    """The report of a free-threaded build running without its GIL: each thread's parked time
    by what it parked on (README, "Free-threaded builds", "Parked time")."""
    wall = (end - att.start_ns) / 1e9
    rows = []
    for tid in att.present:
        t = att.threads[tid]
        by_time = sorted(t.parked_types.items(), key=lambda item: item[1], reverse=True)
        rows.append({"tid": tid, "name": t.name, "parks": t.parks,
                     "parked_s": {kind: ns / 1e9 for kind, ns in zip(PARK_KINDS, t.parked)},
                     "parked_total_s": sum(t.parked) / 1e9, "parked_pct": _pct(sum(t.parked) / 1e9, wall),
                     "critical_section_types": {name: ns / 1e9 for name, ns in by_time}})
    rows.sort(key=lambda r: r["parked_total_s"], reverse=True)
    header = att.header
    return {
        "pid": att.pid, "duration_s": round(wall, 6), "start_ns": att.start_ns,
        "interpreter": att.plan.interpreter, "thread_names": att.names_from,
        "gil": att.gil_disabled,  # why there are no GIL figures
        "threads": rows,
        "exited_threads": {"threads": header.exited_threads, "parked_s": sum(header.exited_parked_ns) / 1e9},
    }


def _functions(p: functions.Profile, total_hold_s: float, wall_s: float, threads: dict[int, ThreadTrace]) -> dict:
    """The hold-time-by-function part of the report."""
    return {
        "logged_s": p.logged_ns / 1e9,
        "logged_pct_of_hold": _pct(p.logged_ns / 1e9, total_hold_s),
        "unlocated_s": {why: ns / 1e9 for why, ns in p.unlocated_ns.items()},
        "places": [{"function": f.function, "file": f.file, "line": f.line, "hold_s": f.hold_ns / 1e9,
                    "hold_pct": _pct(f.hold_ns / 1e9, wall_s), "holds": f.holds, "longest_s": f.longest_ns / 1e9,
                    "threads": sorted(threads[t].name if t in threads else str(t) for t in f.tids)}
                   for f in p.functions],
    }


def fmt_ns(ns: float) -> str:
    """A duration for people: 812ns, 65.5us, 4.19ms, 1.20s."""
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if ns >= scale:
            value = ns / scale
            return f"{value:.3g}{unit}" if value < 100 else f"{value:.0f}{unit}"
    return f"{ns:.0f}ns"


def _quantiles(row: dict) -> str:
    if not row["wait_p50_s"]:
        return "-"
    return "/".join(fmt_ns(row[f"wait_p{round(q * 100)}_s"] * 1e9) for q in QUANTILES)


def render(report: dict) -> str:
    if "gil" in report:
        return render_parked(report)
    lines = [
        f"pid {report['pid']} ({report['interpreter']}), {report['duration_s']:.1f} s: "
        f"GIL held {report['hold_pct']:.1f} % of wall time, waited for {report['wait_pct']:.1f} % "
        "(summed over threads: over 100 % when several wait at once); threads by hold",
        f"wait p50/p90/p99 (upper bounds of power-of-two buckets): {_quantiles(report)}",
        *([] if report["thread_names"] == "threading" else [f"thread names from {report['thread_names']}"]),
        "",
        f"{'tid':>8} {'thread':<20} {'wait s':>8} {'wait %':>7} {'hold s':>8} {'hold %':>7} {'acq':>8} "
        f"{'convoy':>7} {'long':>5}  wait p50/p90/p99",
    ]
    for t in report["threads"]:
        lines.append(
            f"{t['tid']:>8} {t['name'][:20]:<20} {t['wait_s']:>8.3f} {t['wait_pct']:>6.1f}% {t['hold_s']:>8.3f} "
            f"{t['hold_pct']:>6.1f}% {t['acquisitions']:>8} {t['convoy_waits']:>7} {t['long_waits']:>5}  {_quantiles(t)}"
        )
    e = report["exited_threads"]
    if e["threads"]:
        lines.append(f"{'':>8} {'(exited threads)':<20} {e['wait_s']:>8.3f} {'':>7} {e['hold_s']:>8.3f}")
    blamed = [t for t in report["threads"] if t["waited_on"]]
    if blamed:
        lines += ["", "waited on (who held the GIL during each thread's long waits, by time held):"]
        for t in sorted(blamed, key=lambda t: t["wait_s"], reverse=True):
            on = ", ".join(f"{b['name']} ({b['tid']}) {fmt_ns(b['s'] * 1e9)}" for b in t["waited_on"])
            lines.append(f"{t['tid']:>8} {t['name'][:20]:<20} {on}")
    lines += render_functions(report["functions"])
    lines += ["", "long = waits >= 1 ms; convoy = waits >= the switch interval (the 5 ms penalty); "
              "a wait from a forced switch counts from the release"]
    return "\n".join(lines)


def _ns_or_dash(seconds: float) -> str:
    return fmt_ns(seconds * 1e9) if seconds else "-"


PARKED_HEADER = (f"{'tid':>8} {'thread':<20} " + " ".join(f"{h:>9}" for h in ("stw", "crit sec", "app lock", "internal",
                 "other")) + f" {'total':>9} {'parks':>7}  critical sections on")  # semconv.PARK_KINDS, in order
PARKED_LEGEND = ("stw = stop-the-world (suspended, or waiting for the others to stop); crit sec = an object's critical "
                 "section (by its type); app lock = a threading.Lock; internal = the interpreter's own locks")


def parked_line(tid: int, name: str, parked_s: dict[str, float], parks: int, types: dict[str, float]) -> str:
    """One thread's row of parked time (s by semconv.PARK_KINDS; ``types``: critical sections'
    object types, longest first), for report and top."""
    on = ", ".join(f"{type_name or '?'} {fmt_ns(s * 1e9)}" for type_name, s in list(types.items())[:3])
    kinds = " ".join(f"{_ns_or_dash(parked_s[k]):>9}" for k in PARK_KINDS)
    return f"{tid:>8} {name[:20]:<20} {kinds} {_ns_or_dash(sum(parked_s.values())):>9} {parks:>7}  {on}".rstrip()


def gil_disabled_line(why: str) -> str:
    """What a free-threaded process without its GIL shows instead of GIL figures."""
    return (f"{why.split(':')[0]} (a free-threaded build running without a GIL: no GIL figures); "
            "time parked in CPython's parking lot instead, by what each thread parked on")


def render_parked(report: dict) -> str:
    """The text of a free-threaded process's report: parked time by kind, per thread."""
    lines = [f"pid {report['pid']} ({report['interpreter']}), {report['duration_s']:.1f} s: {gil_disabled_line(report['gil'])}",
             *([] if report["thread_names"] == "threading" else [f"thread names from {report['thread_names']}"]),
             "", PARKED_HEADER]
    for t in report["threads"]:
        lines.append(parked_line(t["tid"], t["name"], t["parked_s"], t["parks"], t["critical_section_types"]))
    e = report["exited_threads"]
    if e["threads"]:
        lines.append(f"{'':>8} {'(exited threads)':<20} {'':>49} {fmt_ns(e['parked_s'] * 1e9):>9}")
    lines += ["", PARKED_LEGEND]
    return "\n".join(lines)


def render_functions(f: dict, limit: int = FUNCTIONS) -> list[str]:
    """The by-function table: where each logged hold ended, summed (none if nothing was logged)."""
    if not f["logged_s"]:
        return []
    lines = ["", f"GIL held by function (where each hold of 0.1 ms or more ended: {fmt_ns(f['logged_s'] * 1e9)}, "
                 f"{f['logged_pct_of_hold']:.0f} % of the hold time; shorter holds are not logged one by one):",
             f"{'held':>8} {'% wall':>7} {'holds':>6} {'longest':>8}  function (file:line), threads"]
    for p in f["places"][:limit]:
        lines.append(f"{fmt_ns(p['hold_s'] * 1e9):>8} {p['hold_pct']:>6.1f}% {p['holds']:>6} {fmt_ns(p['longest_s'] * 1e9):>8}  "
                     f"{p['function']} ({p['file']}:{p['line'] or '?'}), {', '.join(p['threads'])}")
    if len(f["places"]) > limit:
        rest = f["places"][limit:]
        lines.append(f"{fmt_ns(sum(p['hold_s'] for p in rest) * 1e9):>8} {'':>7} {sum(p['holds'] for p in rest):>6} "
                     f"{'':>8}  ({len(rest)} more places: --json lists them)")
    for why, seconds in sorted(f["unlocated_s"].items(), key=lambda item: item[1], reverse=True):
        lines.append(f"{fmt_ns(seconds * 1e9):>8} {'':>7} {'':>6} {'':>8}  (location not read: {why})")
    return lines


def to_json(report: dict) -> str:
    return json.dumps(report, indent=1)


def progress_to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)

"""``otel-gil report``: per-thread GIL figures of any running Python process, by pid.

Needs root and bcc (it loads the collector's BPF program itself; the process needs
no otel_gil and no restart). The figures are those of the capture window only.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass

from otel_gil import ring as ringlib


@dataclass
class ThreadFigures:
    tid: int  # as the process sees it (its pid namespace)
    name: str
    wait_s: float
    hold_s: float
    acquisitions: int
    convoy_waits: int
    wait_pct: float  # of the capture's wall time
    hold_pct: float


def _names(pid: int) -> dict[int, str]:
    """Thread id (in the process's own pid namespace) -> comm, from /proc."""
    names: dict[int, str] = {}
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return names  # the process is gone
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/status") as f:
                status = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
            ns_tid = int(status.get("NSpid", task).split()[-1])
            names[ns_tid] = status.get("Name", "").strip()
        except (OSError, ValueError):
            continue
    return names


def capture(pid: int, duration_s: float, progress=print) -> dict:
    """Attach to ``pid`` for ``duration_s`` and return the report as a dict."""
    from collector.__main__ import _check_kernel, _check_privileges, _import_bcc
    from collector import probes
    from collector.tracer import Tracer

    _check_privileges()
    _import_bcc()
    _check_kernel()
    if not os.path.exists(f"/proc/{pid}"):
        raise SystemExit(f"otel-gil report: no process {pid}")
    plan = probes.plan(pid)  # UnsupportedProcess says why not (not Python, free-threaded, ...)
    progress("compiling and loading the BPF program (a few seconds)...")
    tracer = Tracer(2048, 1)
    try:
        traced = tracer.add(pid, plan, 1_000_000, int(sys.getswitchinterval() * 1e9))
        progress(f"attached to pid {pid} ({plan.interpreter}, take_gil by {plan.located_by}); capturing {duration_s:g} s...")
        start = time.monotonic_ns()
        deadline = time.monotonic() + duration_s
        names: dict[int, str] = {}
        while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}"):
            time.sleep(min(0.1, max(deadline - time.monotonic(), 0)))
            tracer.finish_bootstrap()
            names.update(_names(pid))  # threads may exit before the end
        end = time.monotonic_ns()
        if not os.path.exists(f"/proc/{pid}"):
            progress(f"pid {pid} exited during the capture: reporting up to its exit")
        wall = (end - start) / 1e9
        threads = []
        for slot in traced.view.threads():
            c = ringlib.counters(slot, end)
            threads.append(ThreadFigures(
                slot.tid, names.get(slot.tid, "?"), c.wait_ns / 1e9, c.hold_ns / 1e9, c.acquisitions,
                c.convoy_waits, 100 * c.wait_ns / 1e9 / wall, 100 * c.hold_ns / 1e9 / wall,
            ))
        header = traced.view.header
        exited = {"threads": header.exited_threads, "wait_s": header.exited_wait_ns / 1e9,
                  "hold_s": header.exited_hold_ns / 1e9}
    finally:
        tracer.close()
    threads.sort(key=lambda t: t.wait_s + t.hold_s, reverse=True)
    total_wait = sum(t.wait_s for t in threads) + exited["wait_s"]
    total_hold = sum(t.hold_s for t in threads) + exited["hold_s"]
    return {
        "pid": pid,
        "duration_s": round(wall, 6),
        "interpreter": plan.interpreter,
        "hold_pct": round(100 * total_hold / wall, 2),
        "wait_pct": round(100 * total_wait / wall, 2),
        "threads": [asdict(t) for t in threads],
        "exited_threads": exited,
    }


def render(report: dict) -> str:
    lines = [
        f"pid {report['pid']} ({report['interpreter']}), {report['duration_s']:.1f} s: "
        f"GIL held {report['hold_pct']:.1f} % of wall time, waited for {report['wait_pct']:.1f} % "
        "(summed over threads: over 100 % when several wait at once)",
        "",
        f"{'tid':>8} {'thread':<24} {'wait s':>8} {'wait %':>7} {'hold s':>8} {'hold %':>7} {'acq':>8} {'convoy':>7}",
    ]
    for t in report["threads"]:
        lines.append(
            f"{t['tid']:>8} {t['name'][:24]:<24} {t['wait_s']:>8.3f} {t['wait_pct']:>6.1f}% {t['hold_s']:>8.3f} "
            f"{t['hold_pct']:>6.1f}% {t['acquisitions']:>8} {t['convoy_waits']:>7}"
        )
    e = report["exited_threads"]
    if e["threads"]:
        lines.append(f"{'':>8} {'(exited during capture)':<24} {e['wait_s']:>8.3f} {'':>7} {e['hold_s']:>8.3f}")
    return "\n".join(lines)


def to_json(report: dict) -> str:
    return json.dumps(report, indent=1)

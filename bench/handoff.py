"""Cost of tracing per GIL hand-off, side by side in one run.

    sudo .venv/bin/python bench/handoff.py [--pairs 200000] [--rounds 5]
    .venv/bin/python bench/handoff.py --baseline CHECKOUT [--pairs 50000] [--rounds 20]

Workload: a loop of os.write + os.read on a pipe; each call releases and
re-takes the GIL (one hand-off each). Modes, interleaved round by round (baseline first in even rounds, last in odd ones):
  baseline      nothing traces the process
  inprocess     the in-process backend (GOT hooks, no root)
  floor         empty BPF programs on the collector's libc probes: the cost of the traps alone
  unregistered  collector running with another process registered; this one is not
  collector     this process registered with the collector (every hand-off traced)
Timed loops run with kernel.bpf_stats_enabled off. A shorter loop per mode then
runs with it on, to count the collector's BPF program runs (an unregistered
process must trigger none) and their mean run time.
Writes medians to bench/RESULTS.md (section "hand-off") and raw runs to bench/out/.

With ``--baseline``, another otel-gil checkout (its C parts built in place): only the
in-process backend, this checkout's and that one's, each round running baseline, inprocess
and inprocess[baseline] in rotating order (no root needed); the paired difference per
hand-off, round by round, goes to the section "hand-off against a baseline".
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
import stack  # noqa: E402
import results  # noqa: E402

LOOP = r"""
import os, sys, time
sys.stdin.readline()  # attached: go
if sys.argv[2] == "inprocess":
    from otel_gil.inprocess import InProcess
    reg = InProcess(); reg.start()
    state = getattr(reg, "state", reg)  # a --baseline from before the one-value State
    assert state.status == "ok", state.detail
elif sys.argv[2] != "-":
    from otel_gil.client import Registration
    reg = Registration(sys.argv[2]); reg.start(); reg.wait(30)
    state = getattr(reg, "state", reg)  # a --baseline from before the one-value State
    assert state.status == "ok", state.detail
r, w = os.pipe()
n = int(sys.argv[1])
for _ in range(n // 2):  # warm-up: the collector's one-off bootstrap probe is detached by now
    os.write(w, b"x"); os.read(r, 1)
t0 = time.perf_counter_ns()
for _ in range(n):
    os.write(w, b"x"); os.read(r, 1)
print((time.perf_counter_ns() - t0) / n)
"""


def run_loop(pairs: int, sock: str, attach=None, checkout: Path = ROOT) -> float:
    """ns per pair of one loop process (otel_gil from ``checkout``); ``attach(pid)`` runs before it
    starts and returns a detach callable."""
    proc = subprocess.Popen([sys.executable, "-c", LOOP, str(pairs), sock], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, **results.python_in(checkout))
    detach = attach(proc.pid) if attach else None
    out, _ = proc.communicate("go\n")
    if detach:
        detach()
    if proc.returncode:
        raise RuntimeError(f"loop failed ({proc.returncode})")
    return float(out)


def attach_empty(pid: int):
    """Empty programs on the collector's libc probes for ``pid``: what the traps cost with no work."""
    sys.path.insert(0, str(ROOT))
    from otel_gil_collector import probes
    from otel_gil_collector.__main__ import _import_bcc
    from otel_gil_collector.tracer import close_uprobe, open_uprobe

    _import_bcc()
    from bcc import BPF

    bpf = BPF(text="int empty(void *ctx) { return 0; }")
    empty = bpf.load_func(b"empty", BPF.KPROBE).fd
    names = {}
    for probe in probes.plan(pid).probes:
        if not probe.bootstrap:  # detached by the collector after the first hand-off
            name = f"p_otelgil_floor_{pid}_{probe.offset:x}"
            names[name] = open_uprobe(empty, name, probe, pid)

    def detach() -> None:
        for name, fd in names.items():
            close_uprobe(name, fd)
        bpf.cleanup()

    return detach


def prog_stats(pid: int) -> tuple[int, int]:
    """(runs, run time ns) so far, summed over the prog fds of process ``pid`` (needs bpf_stats)."""
    runs = time_ns = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                info = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
        except OSError:
            continue
        if "run_cnt" in info:
            runs += int(info["run_cnt"])
            time_ns += int(info["run_time_ns"])
    return runs, time_ns


def against_baseline(pairs: int, rounds: int, baseline: Path) -> str:
    """The in-process backend of this checkout and of ``baseline``, side by side: RESULTS.md's section."""
    modes = [("baseline", "-", ROOT), ("inprocess", "inprocess", ROOT), ("inprocess[baseline]", "inprocess", baseline)]
    runs: dict[str, list[float]] = {name: [] for name, _, _ in modes}
    for i in range(rounds):
        for name, target, checkout in modes[i % 3:] + modes[:i % 3]:
            runs[name].append(run_loop(pairs, target, checkout=checkout))
        print(f"round {i + 1}/{rounds}: " + ", ".join(f"{k} {v[-1]:.0f} ns" for k, v in runs.items()), flush=True)
    results.OUT.mkdir(exist_ok=True)
    (results.OUT / "handoff-baseline.json").write_text(json.dumps({"ns_per_pair": runs}, indent=1))
    added = {name: [(a - b) / 2 for a, b in zip(runs[name], runs["baseline"])] for name in runs}
    diff = [(a - b) / 2 for a, b in zip(runs["inprocess"], runs["inprocess[baseline]"])]
    q1, _, q3 = statistics.quantiles(diff, n=4)
    lines = [
        f"`.venv/bin/python bench/handoff.py --baseline {baseline} --pairs {pairs} --rounds {rounds}` on "
        f"{results.machine()}. {rounds} rounds, each running the three modes once in rotating order; one pair = "
        "2 hand-offs; `inprocess[baseline]`: the in-process backend of the checkout at --baseline.",
        "",
        "| mode | ns per pair (median) | ns per hand-off added, paired within rounds (median) |",
        "|---|---|---|",
        *(f"| {name} | {statistics.median(runs[name]):.0f} | {statistics.median(added[name]):+.0f} |" for name in runs),
        "",
        f"This checkout's in-process backend against the baseline's: **{statistics.median(diff):+.0f} ns** per hand-off, "
        f"median of each round's difference (quartiles {q1:+.0f} to {q3:+.0f} ns). Round-to-round spread of the "
        f"untraced loop: {100 * (max(runs['baseline']) / min(runs['baseline']) - 1):.0f} %.",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", type=Path, help="another otel-gil checkout (C parts built in place) to compare with")
    args = parser.parse_args()
    if args.baseline:
        section = against_baseline(args.pairs, args.rounds, args.baseline)
        results.write_section("hand-off against a baseline", section)
        print(section)
        return 0
    work = tempfile.mkdtemp(prefix="otel-gil-bench-")
    sock = os.path.join(work, "gil.sock")
    modes = ("baseline", "inprocess", "floor", "unregistered", "collector")
    runs: dict[str, list[float]] = {m: [] for m in modes}
    counted: dict[str, list[tuple[int, int]]] = {"unregistered": [], "collector": []}
    stats = Path("/proc/sys/kernel/bpf_stats_enabled")
    stats_before = stats.read_text().strip()
    stats.write_text("0")
    try:
        for i in range(args.rounds):
            if i % 2 == 0:
                runs["baseline"].append(run_loop(args.pairs, "-"))
            runs["inprocess"].append(run_loop(args.pairs, "inprocess"))
            runs["floor"].append(run_loop(args.pairs, "-", attach_empty))
            collector = stack.start_collector(sock, Path(work) / "collector.log")
            other = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom otel_gil.client import Registration\n"
                                      "r = Registration(sys.argv[1]); r.start(); r.wait(30); time.sleep(3600)", sock],
                                     env={**os.environ, "PYTHONPATH": str(ROOT)})
            time.sleep(1.0)
            try:
                for mode, target in (("unregistered", "-"), ("collector", sock)):
                    runs[mode].append(run_loop(args.pairs, target))
                stats.write_text("1")
                for mode, target in (("unregistered", "-"), ("collector", sock)):
                    before = prog_stats(collector.proc.pid)
                    run_loop(args.pairs // 4, target)
                    after = prog_stats(collector.proc.pid)
                    counted[mode].append((after[0] - before[0], after[1] - before[1]))
                stats.write_text("0")
            finally:
                other.kill()
                other.wait()
                collector.stop()
            if i % 2 == 1:
                runs["baseline"].append(run_loop(args.pairs, "-"))
            print(f"round {i + 1}/{args.rounds}: " + ", ".join(f"{k} {v[-1]:.0f} ns" for k, v in runs.items()), flush=True)
    finally:
        stats.write_text(stats_before)
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    results.OUT.mkdir(exist_ok=True)
    (results.OUT / "handoff.json").write_text(json.dumps({"ns_per_pair": runs, "bpf_runs_and_ns": counted}, indent=1))
    hand_offs = 3 * (args.pairs // 4)  # warm-up and timed loop
    lines = [
        f"`sudo .venv/bin/python bench/handoff.py --pairs {args.pairs} --rounds {args.rounds}` on "
        f"{results.machine()}. Median of {args.rounds} interleaved rounds; one pair = os.write + os.read = 2 hand-offs.",
        "",
        "| mode | ns per pair | vs baseline | ns per hand-off added | BPF runs per hand-off | ns per BPF run |",
        "|---|---|---|---|---|---|",
    ]
    for mode, value in med.items():
        per_run = runs_cell = "-"
        if mode in counted:
            n = statistics.median(c[0] for c in counted[mode])
            runs_cell = f"{n / hand_offs:.3f}"
            if n:
                per_run = f"{statistics.median(c[1] / c[0] for c in counted[mode] if c[0]):.0f}"
        lines.append(f"| {mode} | {value:.0f} | {value / med['baseline']:.3f}x | "
                     f"{(value - med['baseline']) / 2:+.0f} | {runs_cell} | {per_run} |")
    spread = max(runs["baseline"]) / min(runs["baseline"]) - 1
    lines += [
        "",
        f"Round-to-round spread of the baseline alone: {100 * spread:.0f} %. Timed loops run with "
        "kernel.bpf_stats_enabled off; runs and run time come from a separate loop of a quarter the pairs with it on "
        "(which itself adds two clock reads to each run). The floor's programs are empty: the difference between "
        "floor and collector is what the collector's programs cost. The in-process backend needs no trap: its cost is "
        "two clock reads and a few stores per hand-off, in the process itself.",
    ]
    section = "\n".join(lines)
    results.write_section("hand-off", section)
    print(section)
    return 0

if __name__ == "__main__":
    sys.exit(main())

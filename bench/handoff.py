"""Cost of tracing per GIL hand-off, side by side in one run.

    sudo .venv/bin/python bench/handoff.py [--pairs 200000] [--rounds 5]

Workload: a loop of os.write + os.read on a pipe; each call releases and
re-takes the GIL (one hand-off each). Modes, interleaved round by round (baseline first in even rounds, last in odd ones):
  baseline      no collector running
  unregistered  collector running with another process registered; this one is not
  registered    this process registered (every hand-off traced)
With kernel.bpf_stats_enabled, it also counts the collector's BPF program runs
during each loop: an unregistered process must trigger none.
Writes medians to bench/RESULTS.md (section "hand-off") and raw runs to bench/out/.
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
if sys.argv[2] != "-":
    from otel_gil.client import Registration
    reg = Registration(sys.argv[2]); reg.start(); reg.wait(30)
    assert reg.status == "ok", reg.detail
r, w = os.pipe()
n = int(sys.argv[1])
t0 = time.perf_counter_ns()
for _ in range(n):
    os.write(w, b"x"); os.read(r, 1)
print((time.perf_counter_ns() - t0) / n)
"""


def run_loop(pairs: int, sock: str) -> float:
    out = subprocess.run([sys.executable, "-c", LOOP, str(pairs), sock], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return float(out.stdout)


def bpf_runs(pid: int) -> int:
    """BPF program runs so far, summed over the prog fds of process ``pid`` (needs bpf_stats)."""
    total = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                info = f.read()
        except OSError:
            continue
        for line in info.splitlines():
            if line.startswith("run_cnt:"):
                total += int(line.split()[1])
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="otel-gil-bench-")
    sock = os.path.join(work, "gil.sock")
    runs: dict[str, list[float]] = {"baseline": [], "unregistered": [], "registered": []}
    probe_runs: dict[str, list[int]] = {"unregistered": [], "registered": []}
    stats = Path("/proc/sys/kernel/bpf_stats_enabled")
    stats_before = stats.read_text().strip()
    stats.write_text("1")
    for i in range(args.rounds):
        if i % 2 == 0:
            runs["baseline"].append(run_loop(args.pairs, "-"))
        collector = stack.start_collector(sock, Path(work) / "collector.log")
        other = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom otel_gil.client import Registration\n"
                                  "r = Registration(sys.argv[1]); r.start(); r.wait(30); time.sleep(3600)", sock],
                                 env={**os.environ, "PYTHONPATH": str(ROOT)})
        time.sleep(1.0)
        try:
            for mode, target in (("unregistered", "-"), ("registered", sock)):
                before = bpf_runs(collector.proc.pid)
                runs[mode].append(run_loop(args.pairs, target))
                probe_runs[mode].append(bpf_runs(collector.proc.pid) - before)
        finally:
            other.kill()
            other.wait()
            collector.stop()
        if i % 2 == 1:
            runs["baseline"].append(run_loop(args.pairs, "-"))
        print(f"round {i + 1}/{args.rounds}: " + ", ".join(f"{k} {v[-1]:.0f} ns" for k, v in runs.items()), flush=True)
    stats.write_text(stats_before)
    shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    results.OUT.mkdir(exist_ok=True)
    (results.OUT / "handoff.json").write_text(json.dumps({"ns_per_pair": runs, "bpf_runs": probe_runs}, indent=1))
    lines = [
        f"`sudo .venv/bin/python bench/handoff.py --pairs {args.pairs} --rounds {args.rounds}` on "
        f"{results.machine()}. Median of {args.rounds} interleaved rounds; one pair = os.write + os.read = 2 hand-offs.",
        "",
        "| mode | ns per pair | vs baseline | ns per hand-off added | BPF program runs per loop (median) |",
        "|---|---|---|---|---|",
    ]
    for mode, value in med.items():
        runs_cell = f"{statistics.median(probe_runs[mode]):.0f}" if mode in probe_runs else "-"
        lines.append(
            f"| {mode} | {value:.0f} | {value / med['baseline']:.3f}x | {(value - med['baseline']) / 2:+.0f} | {runs_cell} |"
        )
    spread = max(runs["baseline"]) / min(runs["baseline"]) - 1
    lines += [
        "",
        f"Round-to-round spread of the baseline alone: {100 * spread:.0f} %. kernel.bpf_stats_enabled is on "
        "during the runs (to count program runs), which adds two clock reads per program run to the registered cost.",
    ]
    section = "\n".join(lines)
    results.write_section("hand-off", section)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""otel-gil side by side with the tools a user would reach for instead, on one ground truth.

    sudo .venv/bin/python bench/peers.py [--rounds 3] [--seconds 5]

Workload: bench/peers_workload.py (a hog holding the GIL for 20 ms every 50 ms via
ctypes.PyDLL, two victims woken at each burst's start). Why the burst ends at a
deadline and is not timed after the call: the hog drops the GIL to the waiting
victims as soon as the call returns, so a clock read after it would add their turn. Modes, in rotating order
each round, each run twice in fresh processes: once as is (accuracy: every tool's
reading against the truth) and once with a pipe-pinging worker thread (overhead:
its ops/s against no instrumentation):
  none           no instrumentation
  otel           OpenTelemetry SDK, a span per victim wake-up and one over the hog's run
  otel+gil-inprocess  the same with otel-gil, in-process backend: reading = the spans' gil.*
  otel+gil-collector  the same with otel-gil, collector backend (collector running)
  py-spy         `py-spy record --gil --idle --threads --rate 100` attached for the run:
                 reading = the hog's share of GIL-holding samples
  gilknocker     KnockKnock(polling_interval_micros=1000) in-process: reading = its
                 contention_metric (a fraction of time; the matching truth is the
                 GIL's busy share, which the hog's hold is)
Writes the section "peers" of bench/RESULTS.md and raw runs to bench/out/peers.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
import results  # noqa: E402
import stack  # noqa: E402

WORKLOAD = Path(__file__).with_name("peers_workload.py")
MODES = ("none", "otel", "otel+gil-inprocess", "otel+gil-collector", "py-spy", "gilknocker")
PYSPY_RATE = 100
BIN = Path(sys.executable).parent


def run(mode: str, seconds: float, sock: str, worker: bool, work: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OTEL_GIL_SOCKET": sock}
    argv = [sys.executable, str(WORKLOAD), mode, str(seconds), *(["worker"] if worker else [])]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    pid = json.loads(proc.stdout.readline())["ready"]
    spy = None
    if mode == "py-spy":
        raw = work / "py-spy.raw"
        spy = subprocess.Popen([str(BIN / "py-spy"), "record", "--pid", str(pid), "--rate", str(PYSPY_RATE),
                                "--duration", f"{seconds + 3:g}", "--gil", "--idle", "--threads", "--format", "raw",
                                "-o", str(raw)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)  # attached
        proc.stdin.write("\n")
        proc.stdin.flush()
    out, _ = proc.communicate(timeout=seconds + 60)
    if proc.returncode:
        raise RuntimeError(f"{mode} workload failed")
    result = json.loads(out.splitlines()[-1])
    if spy is not None:
        _, err = spy.communicate(timeout=60)
        if spy.returncode:
            raise RuntimeError(f"py-spy failed: {err}")
        samples: dict[int, int] = {}
        for line in raw.read_text().splitlines():
            m = re.match(r"thread \((0x[0-9a-fA-F]+|\d+)\)[^ ]* .* (\d+)$", line)
            if m:
                tid = int(m.group(1), 0)
                samples[tid] = samples.get(tid, 0) + int(m.group(2))
        result["py_spy_samples"] = samples
    return result


def reading(r: dict) -> dict:
    """Each tool's reading of the hog's GIL share (and, for otel-gil, the victims' wait) vs the truth."""
    truth = r["truth"]
    hold = truth["hog_hold_ns"] / r["wall_ns"]
    out = {"truth_hold_pct": 100 * hold}
    if "otel_gil" in r:
        ours = r["otel_gil"]
        out["hold_pct"] = 100 * ours["hog_hold_ns"] / r["wall_ns"]
        out["wait_err_pct"] = 100 * max(abs(w / t - 1) for w, t in zip(ours["victim_wait_ns"], truth["victim_wait_ns"]))
    if "py_spy_samples" in r:
        out["hold_pct"] = 100 * r["py_spy_samples"].get(r["tids"]["hog"], 0) / (PYSPY_RATE * r["wall_ns"] / 1e9)
    if "gilknocker_contention" in r:
        out["hold_pct"] = 100 * r["gilknocker_contention"]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="otel-gil-bench-"))
    sock = str(work / "gil.sock")
    collector = stack.start_collector(sock, work / "collector.log")
    raw: dict[str, dict[str, list[dict]]] = {m: {"accuracy": [], "overhead": []} for m in MODES}
    try:
        for i in range(args.rounds):
            for mode in MODES[i % len(MODES):] + MODES[:i % len(MODES)]:
                raw[mode]["accuracy"].append(run(mode, args.seconds, sock, False, work))
                raw[mode]["overhead"].append(run(mode, args.seconds, sock, True, work))
            print(f"round {i + 1}/{args.rounds}: " + ", ".join(
                f"{m} {raw[m]['overhead'][-1]['ops_per_s']:.0f} ops/s" for m in MODES), flush=True)
    finally:
        collector.stop()
    results.OUT.mkdir(exist_ok=True)
    (results.OUT / "peers.json").write_text(json.dumps(raw, indent=1))
    ops = {m: statistics.median(r["ops_per_s"] for r in raw[m]["overhead"]) for m in MODES}
    versions = ", ".join(f"{p} {metadata.version(p)}" for p in ("opentelemetry-sdk", "py-spy", "gilknocker"))
    lines = [
        f"`sudo .venv/bin/python bench/peers.py --rounds {args.rounds} --seconds {args.seconds:g}` on "
        f"{results.machine()}; {versions}. Medians of {args.rounds} rounds, modes in rotating order, fresh "
        "processes. Truth: the hog's PyDLL bursts (20 ms every 50 ms), a sleep to an absolute deadline (the "
        "truth is the requested span: waking takes some µs more); each victim "
        "waits from its wake-up to the burst's end. Overhead: ops/s of a worker thread pinging a pipe "
        "(2 GIL hand-offs per op) next to the same hog.",
        "",
        "| mode | worker ops/s | vs none | reads the hog's GIL share as | truth | error | victims' wait error |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in MODES:
        reads = [reading(r) for r in raw[m]["accuracy"]]
        truth = statistics.median(x["truth_hold_pct"] for x in reads)
        cells = ["-", f"{truth:.1f} %", "-", "-"]
        if "hold_pct" in reads[0]:
            got = statistics.median(x["hold_pct"] for x in reads)
            cells[0], cells[2] = f"{got:.1f} %", f"{got - truth:+.1f} points"
        if "wait_err_pct" in reads[0]:
            cells[3] = f"{statistics.median(x['wait_err_pct'] for x in reads):.2f} %"
        lines.append(f"| {m} | {ops[m]:.0f} | {ops[m] / ops['none']:.3f}x | " + " | ".join(cells) + " |")
    lines += [
        "",
        "What each reading is: otel-gil, the hog span's `gil.hold_ms` over the wall time (and the victims' spans' "
        "`gil.wait_ms` summed, against their truth); py-spy, the hog thread's GIL-holding samples over "
        f"rate x the run's wall time ({PYSPY_RATE}/s, attached for the whole run; it pauses the process for each sample unless --nonblocking, and says "
        "nothing about waiting); gilknocker, its contention metric, the share of its own polls that found the "
        "GIL taken (no per-thread view). Only otel-gil measures who waited and for how long.",
    ]
    body = "\n".join(lines)
    results.write_section("peers", body)
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())

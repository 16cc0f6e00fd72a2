"""What otel-gil adds to a switch of context: an asyncio task step (on asyncio's loop and on
uvloop's), and a greenlet switch.

    .venv/bin/python bench/switches.py [--steps 20000] [--blocks 30] [--rounds 5]

Each is a charge point (otel_gil/context_switches.c): the thread's slot counters are read,
what ran since the last one is charged to the span that ran, and the span current in the
context switched to is looked up. Compared inside one process, in interleaved blocks, the
in-process backend writing the slots in both modes (its cost per GIL hand-off is
bench/handoff.py's); what differs is whether otel-gil's span hooks, and with them the switch
hooks, are on:
  tasks        ten asyncio tasks, each in a span of its own, each ``await asyncio.sleep(0)``
               in a loop: a step enters the task's context and leaves it (Context.run
               replaced before 3.14, a context watcher since)
  uvloop       the same tasks on uvloop's loop, which enters their contexts in C (its GOT
               entries of PyContext_Enter/Exit hooked before 3.14, the watcher since)
  greenlets    two greenlets, each in a span of its own, switching to each other
               (greenlet.settrace, per thread); ``floor``: a tracer that does nothing, in C
               (``"".format``): what greenlet's own call of any tracer costs
Each round is a fresh process; a round's figure per mode is its median block, the cost is the
median over rounds of (on - off) per step or switch. Writes the section "switches" of
bench/RESULTS.md and the raw runs to bench/out/switches.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
import results  # noqa: E402

CHILD = r"""
import asyncio, json, statistics, sys, time
import greenlet, uvloop
from opentelemetry.sdk.trace import TracerProvider
from otel_gil.inprocess import InProcess
from otel_gil.spans import GilSpanProcessor, hook_provider, unwrap_span, wrap_span

steps, blocks = int(sys.argv[1]), int(sys.argv[2])
registration = InProcess()
registration.start()
assert registration.state.status == "ok", registration.state.detail
provider = TracerProvider()
hooks = GilSpanProcessor(registration, None, fast=True)
hook_provider(provider, hooks)
tracer = provider.get_tracer("bench")

async def task(n):
    with tracer.start_as_current_span("task"):
        for _ in range(n):
            await asyncio.sleep(0)

async def _gather():
    await asyncio.gather(*(task(steps // 10) for _ in range(10)))

def tasks():
    t0 = time.perf_counter_ns()
    asyncio.run(_gather())
    return (time.perf_counter_ns() - t0) / steps

def uvloop_tasks():
    t0 = time.perf_counter_ns()
    uvloop.run(_gather())
    return (time.perf_counter_ns() - t0) / steps

def greenlets():
    hub = greenlet.getcurrent()
    def body():
        with tracer.start_as_current_span("greenlet"):
            for _ in range(steps // 2):
                hub.switch()
    a, b = greenlet.greenlet(body), greenlet.greenlet(body)
    t0 = time.perf_counter_ns()
    while not (a.dead and b.dead):
        a.switch()
        b.switch()
    return (time.perf_counter_ns() - t0) / (2 * steps)  # switches: into each greenlet and back

with tracer.start_as_current_span("first"):  # this thread's greenlet tracer is set at its first span
    pass
tracer_on = greenlet.gettrace()
assert tracer_on is not None, "no greenlet tracer was set"

def block(kind, on):
    if on == "on":
        wrap_span(hooks)
        greenlet.settrace(tracer_on)
    else:
        unwrap_span()
        greenlet.settrace("".format if on == "floor" else None)
    return {"tasks": tasks, "uvloop": uvloop_tasks, "greenlets": greenlets}[kind]()

unwrap_span()
MODES = [("tasks", "off"), ("tasks", "on"), ("uvloop", "off"), ("uvloop", "on"), ("greenlets", "off"),
         ("greenlets", "floor"), ("greenlets", "on")]
for kind, on in MODES:
    block(kind, on)  # warm-up
times = {f"{kind}/{on}": [] for kind, on in MODES}
for _ in range(blocks):
    for kind, on in MODES:
        times[f"{kind}/{on}"].append(block(kind, on))
print(json.dumps({mode: statistics.median(t) for mode, t in times.items()}))
"""
MODES = ("tasks/off", "tasks/on", "uvloop/off", "uvloop/on", "greenlets/off", "greenlets/floor", "greenlets/on")


def run(steps: int, blocks: int) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, str(steps), str(blocks)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode:
        raise RuntimeError(f"the benchmark process failed:\n{done.stderr}")
    return json.loads(done.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20000, help="task steps (and greenlet switches) per block")
    parser.add_argument("--blocks", type=int, default=30, help="blocks per mode and round")
    parser.add_argument("--rounds", type=int, default=5, help="fresh processes")
    args = parser.parse_args()
    raw: dict[str, list[float]] = {m: [] for m in MODES}
    for i in range(args.rounds):
        for mode, ns in run(args.steps, args.blocks).items():
            raw[mode].append(ns)
        print(f"round {i + 1}/{args.rounds}: " + ", ".join(f"{m} {raw[m][-1]:.0f} ns" for m in MODES), flush=True)
    results.OUT.mkdir(exist_ok=True)
    (results.OUT / "switches.json").write_text(json.dumps(raw, indent=1))
    med = {m: statistics.median(raw[m]) for m in MODES}
    added = {k: statistics.median(on - off for on, off in zip(raw[f"{k}/on"], raw[f"{k}/off"])) for k in ("tasks", "uvloop", "greenlets")}
    floor = statistics.median(f - off for f, off in zip(raw["greenlets/floor"], raw["greenlets/off"]))
    body = "\n".join([
        f"`.venv/bin/python bench/switches.py --steps {args.steps} --blocks {args.blocks} --rounds {args.rounds}` on "
        f"{results.machine()}. {args.rounds} rounds, each a fresh process timing {args.blocks} interleaved blocks per "
        "mode (its median block counts), the in-process backend on in every mode; `on`: otel-gil's span hooks and "
        "switch hooks, each task and greenlet in a span of its own.",
        "",
        "| mode | ns per task step or greenlet switch (median) |",
        "|---|---|",
        *(f"| {m} | {med[m]:.0f} |" for m in MODES),
        "",
        f"otel-gil adds **{added['tasks']:.0f} ns per asyncio task step**, two context switches (the task's context "
        f"entered and left): {added['tasks'] / 2:.0f} ns a switch (target ≤ 150 ns: "
        f"{'met' if added['tasks'] / 2 <= 150 else 'not met'}); **{added['uvloop']:.0f} ns per uvloop task step** "
        f"(its GOT entries of PyContext_Enter/Exit hooked before 3.14: {added['uvloop'] / 2:.0f} ns a switch), on a "
        f"step of {med['uvloop/off']:.0f} ns against asyncio's {med['tasks/off']:.0f}; and **{added['greenlets']:.0f} "
        "ns per greenlet "
        f"switch** (target ≤ 150 ns: {'met' if added['greenlets'] <= 150 else 'not met'}), of which {floor:.0f} ns are "
        f"greenlet calling a tracer at all (`floor`: one that does nothing, in C) and {added['greenlets'] - floor:.0f} ns "
        "otel-gil's charge point; paired within rounds.",
    ])
    results.write_section("switches", body)
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())

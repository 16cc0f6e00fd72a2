"""What parked time per request adds to an asyncio task step on a free-threaded build without
its GIL: two charge points of otel_gil/park_contexts.c (Context.run replaced: the task's context
entered and left).

    .venv/bin/python bench/park_switches.py --python .venv-matrix/3.13t/bin/python [--rounds 5]

One process per round, otel-gil instrumented (in-process backend) throughout; ten asyncio tasks,
each in a span of its own, each ``await asyncio.sleep(0)`` in a loop, timed in blocks with parks
timed (``parks.start``: the sem_* hooks, which no step reaches, and the charge points) and not
(``parks.stop``), interleaved. A round's figure per mode is its median block; the cost is the
median over rounds of (on - off) per step. Writes the section "park switches" of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import results  # noqa: E402

CHILD = r"""
import asyncio, json, statistics, sys, time
from opentelemetry.sdk.trace import TracerProvider
from otel_gil import parks
from otel_gil.instrumentor import GilInstrumentor

steps, blocks = int(sys.argv[1]), int(sys.argv[2])
assert not sys._is_gil_enabled()
provider = TracerProvider()
GilInstrumentor().instrument(tracer_provider=provider, backend="inprocess")
tracer = provider.get_tracer("bench")

async def ten():  # tasks of steps // 10 steps each, in a span each
    async def task():
        with tracer.start_as_current_span("task"):
            for _ in range(steps // 10):
                await asyncio.sleep(0)
    await asyncio.gather(*(task() for _ in range(10)))

def block(mode):
    if mode == "on":
        assert parks.start(1_000_000) is not None and parks.contexts
    else:
        parks.stop()
    t0 = time.perf_counter_ns()
    asyncio.run(ten())
    return (time.perf_counter_ns() - t0) / steps

block("on"), block("off")  # warm-up, not counted
times = {"off": [], "on": []}
for i in range(blocks):
    for mode in (("on", "off") if i % 2 else ("off", "on")):
        times[mode].append(block(mode))
GilInstrumentor().uninstrument()
print(json.dumps({mode: statistics.median(t) for mode, t in times.items()}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", required=True, help="a free-threaded build's interpreter")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20000, help="task steps per block")
    parser.add_argument("--blocks", type=int, default=20, help="blocks per mode and round")
    args = parser.parse_args()
    rounds = [json.loads(subprocess.run([args.python, "-c", CHILD, str(args.steps), str(args.blocks)],
                                        capture_output=True, text=True, check=True, **results.python_in(ROOT)).stdout)
              for _ in range(args.rounds)]
    off, on = (statistics.median(r[m] for r in rounds) for m in ("off", "on"))
    added = sorted(r["on"] - r["off"] for r in rounds)
    version = results.python_version(args.python)
    body = f"""
`.venv/bin/python bench/park_switches.py --python {args.python} --rounds {args.rounds} --steps {args.steps} \
--blocks {args.blocks}` on {results.machine()}; the child: CPython {version} free-threaded, GIL off. Ten asyncio
tasks, each in a span, each stepping through `await asyncio.sleep(0)`; parks timed (`on`: the sem_* hooks and the
charge points of park_contexts.c) or not, in interleaved blocks; medians over rounds.

| mode | ns per task step |
|---|---|
| off | {off:.0f} |
| on | {on:.0f} |

Parked time per request adds **{statistics.median(added):.0f} ns per asyncio task step** (two charge points: the
task's context entered and left; {added[0]:.0f} to {added[-1]:.0f} over rounds), on a step of {off:.0f} ns.
"""
    results.write_section("park switches", body)
    print(body)


if __name__ == "__main__":
    main()

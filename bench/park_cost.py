"""What the park hooks (otel_gil/parks.py) add on a free-threaded build running without its GIL.

    .venv/bin/python bench/park_cost.py --python .venv-matrix/3.13t/bin/python [--rounds 7]

In one process per round, blocks with the hooks on and off interleaved:
  park        two threads hand a token back and forth through two ``threading.Lock``s: every
              hand-off parks the taker (one ``sem_clockwait``/``sem_wait`` of libpython): the
              hook's cost per park is (on - off) per hand-off
  uncontended ``lock.acquire(); lock.release()`` on a lock nobody else takes: never parks,
              never reaches the hook; the figure must not move
A round's figure per mode is its median block (after a warm-up block); the cost is the median over
rounds of (on - off).
Writes the section "park hooks" of bench/RESULTS.md.
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
import json, statistics, sys, threading, time
from otel_gil import parks

handoffs, ops, blocks = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
assert not sys._is_gil_enabled()

def pingpong():
    a, b = threading.Lock(), threading.Lock()
    a.acquire(); b.acquire()
    def other():
        for _ in range(handoffs):
            a.acquire()
            b.release()
    t = threading.Thread(target=other)
    t.start()
    t0 = time.perf_counter_ns()
    for _ in range(handoffs):
        a.release()
        b.acquire()
    elapsed = time.perf_counter_ns() - t0
    t.join()
    return elapsed / (2 * handoffs)

def uncontended():
    lock = threading.Lock()
    t0 = time.perf_counter_ns()
    for _ in range(ops):
        lock.acquire(); lock.release()
    return (time.perf_counter_ns() - t0) / ops

figures = {"park": {"on": [], "off": []}, "uncontended": {"on": [], "off": []}}
pingpong(), uncontended()  # warm-up, not counted
for block in range(blocks):
    for mode in (("on", "off") if block % 2 else ("off", "on")):
        if mode == "on":
            assert parks.start(1_000_000) is not None
        else:
            parks.stop()
        figures["park"][mode].append(pingpong())
        figures["uncontended"][mode].append(uncontended())
parks.stop()
print(json.dumps({k: {m: statistics.median(v) for m, v in d.items()} for k, d in figures.items()}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", required=True, help="a free-threaded build's interpreter")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--handoffs", type=int, default=20000)
    parser.add_argument("--ops", type=int, default=200000)
    parser.add_argument("--blocks", type=int, default=10)
    args = parser.parse_args()
    rounds = []
    for _ in range(args.rounds):
        done = subprocess.run([args.python, "-c", CHILD, str(args.handoffs), str(args.ops), str(args.blocks)],
                              capture_output=True, text=True, check=True, **results.python_in(ROOT))
        rounds.append(json.loads(done.stdout))
    rows = []
    for name in ("park", "uncontended"):
        off = statistics.median(r[name]["off"] for r in rounds)
        on = statistics.median(r[name]["on"] for r in rounds)
        diffs = sorted(r[name]["on"] - r[name]["off"] for r in rounds)
        rows.append(f"| {name} | {off:.0f} | {on:.0f} | {statistics.median(diffs):+.0f} | {diffs[0]:+.0f} to "
                    f"{diffs[-1]:+.0f} | {statistics.median(r[name]['on'] / r[name]['off'] for r in rounds):.3f} |")
    version = subprocess.run([args.python, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True,
                             text=True, check=True).stdout.strip()
    body = f"""
`.venv/bin/python bench/park_cost.py --python {args.python} --rounds {args.rounds} --handoffs {args.handoffs} \
--ops {args.ops} --blocks {args.blocks}` on {results.machine()}; the child: CPython {version} free-threaded, GIL off.
{__doc__.split(chr(10) + chr(10))[2].strip().rsplit(chr(10), 1)[0]}

| case | off, ns | on, ns | on - off (median of rounds) | range over rounds | on / off |
|---|---|---|---|---|---|
{chr(10).join(rows)}
"""
    results.write_section("park hooks", body)
    print(body)


if __name__ == "__main__":
    main()

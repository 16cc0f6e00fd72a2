"""What timing parks adds on a free-threaded build running without its GIL: the in-process park
hooks (otel_gil/parks.py) and the collector's uprobe + uretprobe on ``_PyParkingLot_Park``
(``otel-gil report`` and ``top``), side by side.

    sudo .venv/bin/python bench/park_cost.py --python .venv-matrix/3.13t/bin/python [--rounds 7]

One child process per round runs blocks in five modes, their order rotating from block to block:
off (nothing), inprocess (``parks.start()``), collector (the report's probes attached to the child
for that block only, detached after it), floor (the same two probes running empty programs: the
traps' own cost), entry floor (the entry's alone, empty: what the uretprobe adds). Each block times:
  park        ``_PyParkingLot_Park`` (ctypes) on a private list's ``ob_mutex``, timeout 0: a whole
              park (bucket lock, semaphore, a ``sem_clockwait`` already past its deadline, dequeue)
              and all either writer does for one, a critical section's type read included; each
              call is checked to count as one park of that address (collector: its map;
              in-process: the slots). The futex still goes through a timer wake-up here (80-160
              µs, its noise the kernel's), so the hooks' own microseconds are not resolved by it
  returning   ``_PyParkingLot_Park`` on a word that is not what it expects: it returns at once
              (Py_PARK_AGAIN), through the collector's uprobe and uretprobe and their BPF programs
              all the same (each call checked to count as one park): the collector's cost per
              park, free of the sleep's noise; no ``sem_*`` call, so the in-process hooks never
              run (their row: the noise floor)
  uncontended ``lock.acquire(); lock.release()`` on a lock nobody else takes: never parks,
              never reaches either hook; the figure must not move
A round's figure per mode is its median block (after a warm-up); the cost is the median over
rounds of (mode - off). Needs root and bcc for the collector mode (``--no-collector``: without).
Writes the section "park hooks" of bench/RESULTS.md.
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
sys.path.insert(0, str(ROOT / "bench"))
import results  # noqa: E402

CASES = ("park", "returning", "uncontended")
CHILD = r"""
import ctypes, json, sys, threading, time
from otel_gil import parks, pystructs

timed_out, calls, ops = (int(a) for a in sys.argv[1:4])
assert not sys._is_gil_enabled()
lot_park = ctypes.pythonapi._PyParkingLot_Park
lot_park.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int)
private = []
mutex = id(private) + pystructs.PARKING[sys.version_info[:2]].ob_mutex
unlocked = ctypes.c_uint8(ctypes.c_uint8.from_address(mutex).value)
word, other = ctypes.c_uint64(0), ctypes.c_uint64(1)

def parks_so_far():
    return sum(slot.parks for slot in parks.current.ring.threads()) if parks.current else 0

def park():  # ns per park, and the parks the in-process hooks counted (0 if off)
    before, t0 = parks_so_far(), time.perf_counter_ns()
    for _ in range(timed_out):
        lot_park(mutex, ctypes.addressof(unlocked), 1, 0, None, 0)
    return (time.perf_counter_ns() - t0) / timed_out, parks_so_far() - before

def returning():
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        lot_park(ctypes.addressof(word), ctypes.addressof(other), 8, -1, None, 0)
    return (time.perf_counter_ns() - t0) / calls

def uncontended():
    lock = threading.Lock()
    t0 = time.perf_counter_ns()
    for _ in range(ops):
        lock.acquire(); lock.release()
    return (time.perf_counter_ns() - t0) / ops

park(), returning(), uncontended()  # warm-up, not counted
print("ready", mutex, ctypes.addressof(word), flush=True)
for mode in sys.stdin:
    if mode.strip() == "inprocess":
        assert parks.start(1_000_000) is not None
    (ns, parked), back, free = park(), returning(), uncontended()
    print(json.dumps({"park": ns, "returning": back, "uncontended": free, "parked": parked}), flush=True)
    parks.stop()
"""


def attach_floor(pid: int, plan, empty: int, returns: bool) -> list[tuple[str, int]]:
    """``plan``'s probes on ``pid`` (its uretprobe only if ``returns``) running the program
    ``empty`` (returns at once): the traps alone."""
    from otel_gil_collector.tracer import open_uprobe

    chosen = [p for p in plan.probes if returns or not p.retprobe]
    names = [f"{'r' if p.retprobe else 'p'}_otelgil_floor_{pid}_{p.offset:x}" for p in chosen]
    return [(name, open_uprobe(empty, name, probe, pid)) for name, probe in zip(names, chosen)]


def one_round(args: argparse.Namespace, tracer, empty: int) -> dict[str, dict[str, float]]:
    """One child's median block per mode and case."""
    from otel_gil_collector import attach, probes
    from otel_gil_collector.tracer import close_uprobe

    child = subprocess.Popen([args.python, "-c", CHILD, str(args.parks), str(args.calls), str(args.ops)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, **results.python_in(ROOT))
    modes = ("off", "inprocess", "collector", "floor", "entry floor") if tracer else ("off", "inprocess")
    blocks: dict[str, dict[str, list[float]]] = {m: {c: [] for c in CASES} for m in modes}
    counted = {}  # the collector's parks by address so far (its map keeps them across blocks)
    try:
        ready, mutex, word = child.stdout.readline().split()
        assert ready == "ready", ready
        plan = probes.plan_parks(child.pid, probes.interpreter(child.pid)) if tracer else None
        for block in range(args.blocks):
            for mode in modes[block % len(modes):] + modes[:block % len(modes)]:
                traced = tracer.add(child.pid, plan, attach.LONG_NS, int(sys.getswitchinterval() * 1e9)) \
                    if mode == "collector" else None
                floor = attach_floor(child.pid, plan, empty, mode == "floor") if mode.endswith("floor") else []
                child.stdin.write(mode + "\n")
                child.stdin.flush()
                got = json.loads(child.stdout.readline())
                for name, fd in floor:
                    close_uprobe(name, fd)
                if traced:
                    by_addr = tracer.parks_by_address(child.pid)
                    tracer.remove(child.pid, wait=True)
                    now = {at: sum(n for (_, addr), (_, n) in by_addr if addr == int(at)) for at in (mutex, word)}
                    got["parked"] = now[mutex] - counted.get(mutex, 0)
                    assert now[word] - counted.get(word, 0) == args.calls, (now, counted, args.calls)
                    counted = now
                if mode in ("inprocess", "collector"):
                    assert got["parked"] == args.parks, (mode, got["parked"], args.parks)
                for case in CASES:
                    blocks[mode][case].append(got[case])
    finally:
        child.stdin.close()
        child.wait()
    return {m: {c: statistics.median(v) for c, v in d.items()} for m, d in blocks.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", required=True, help="a free-threaded build's interpreter")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--parks", type=int, default=3000, help="timed-out parks per block")
    parser.add_argument("--calls", type=int, default=50000, help="returning calls per block")
    parser.add_argument("--ops", type=int, default=200000)
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--no-collector", action="store_true", help="in-process only (no root or bcc needed)")
    args = parser.parse_args()
    tracer, load = None, os.getloadavg()[0]
    if not args.no_collector:
        from otel_gil_collector.__main__ import _check_kernel, _check_privileges, _import_bcc

        _check_privileges(), _import_bcc(), _check_kernel()  # each fails saying what to do
        from bcc import BPF
        from otel_gil_collector.tracer import Tracer

        tracer, floor = Tracer(2048, 1, parks=True), BPF(text="int empty(void *ctx) { return 0; }")
    try:
        empty = floor.load_func(b"empty", BPF.KPROBE).fd if tracer else -1
        rounds = [one_round(args, tracer, empty) for _ in range(args.rounds)]
    finally:
        if tracer:
            tracer.close()
            floor.cleanup()
    rows = []
    for case in CASES:
        off = statistics.median(r["off"][case] for r in rounds)
        for mode in (m for m in rounds[0] if m != "off"):
            on = statistics.median(r[mode][case] for r in rounds)
            diffs = sorted(r[mode][case] - r["off"][case] for r in rounds)
            rows.append(f"| {case} | {mode} | {off:.0f} | {on:.0f} | {statistics.median(diffs):+.0f} | {diffs[0]:+.0f} to "
                        f"{diffs[-1]:+.0f} | {statistics.median(r[mode][case] / r['off'][case] for r in rounds):.3f} |")
    version = results.python_version(args.python)
    command = (f"{'sudo ' if tracer else ''}.venv/bin/python bench/park_cost.py --python {args.python} --rounds {args.rounds} "
               f"--parks {args.parks} --calls {args.calls} --ops {args.ops} --blocks {args.blocks}{'' if tracer else ' --no-collector'}")
    body = f"""
`{command}` on {results.machine()}, load average {load:.1f} at the start; the child: CPython {version}
free-threaded, GIL off.
{__doc__.split(chr(10) + chr(10))[2].strip().rsplit(chr(10), 1)[0]}

| case | mode | off, ns | on, ns | on - off (median of rounds) | range over rounds | on / off |
|---|---|---|---|---|---|---|
{chr(10).join(rows)}
"""
    results.write_section("park hooks", body)
    print(body)


if __name__ == "__main__":
    main()

"""What one poll of ``otel-gil report`` (and ``top``) costs on a free-threaded build running
without its GIL whose threads park all the time: this checkout's collector against another's.

    sudo .venv/bin/python bench/report_poll.py --python .venv-matrix/3.13t/bin/python \
        --baseline CHECKOUT [--rounds 3] [--polls 300]

Each round attaches once with each checkout's collector (alternating which goes first) to a
child of its own: eight threads contending on four ``threading.Lock``s, a new lock now and then
(about a thousand addresses parked on by the end); ``Attachment.poll()`` every 10 ms, timed. A
run's figure is its median poll; the figures are medians over rounds. Writes the section
"report poll" of bench/RESULTS.md.
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

TARGET = r"""
import threading, time
locks = [threading.Lock() for _ in range(4)]
def work(i):
    n = 0
    while True:
        with locks[i % 4]:
            time.sleep(0.0002)
        n += 1
        if n % 50 == 0:
            locks[i % 4] = threading.Lock()  # new addresses now and then
for i in range(8):
    threading.Thread(target=work, args=(i,), daemon=True).start()
print("ready", flush=True)
input()
"""

POLLS = r"""
import inspect, json, statistics, subprocess, sys, time
from otel_gil_collector.attach import Attachment
parks = {"parks": True} if "parks" in inspect.signature(Attachment).parameters else {}  # a baseline before 2026-11
python, target, polls = sys.argv[1], sys.argv[2], int(sys.argv[3])
child = subprocess.Popen([python, "-c", target], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         env={"PYTHON_GIL": "0"})
try:
    assert child.stdout.readline() == "ready\n"
    with Attachment(child.pid, "bench", progress=lambda line: None, **parks) as att:
        assert att.gil_disabled, "its GIL is on: no parks to time"
        times = []
        for _ in range(polls):
            time.sleep(0.01)
            start = time.perf_counter_ns()
            att.poll()
            times.append(time.perf_counter_ns() - start)
        addresses = len(att._tracer._bpf["park_addrs"])
    print(json.dumps({"poll_ns": statistics.median(times), "addresses": addresses}))
finally:
    child.kill()
"""


def run(python: str, checkout: Path, polls: int) -> dict:
    """One attachment with ``checkout``'s collector: its median poll (ns) and addresses parked on."""
    env = {**os.environ, "PYTHONPATH": f"{checkout / 'collector'}:{checkout}"}
    done = subprocess.run([sys.executable, "-c", POLLS, python, TARGET, str(polls)], capture_output=True, text=True,
                          cwd=checkout, env=env)
    if done.returncode:
        raise SystemExit(f"report_poll.py: the run with {checkout}'s collector failed:\n{done.stderr}")
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", required=True, help="a free-threaded CPython (3.13t)")
    parser.add_argument("--baseline", type=Path, required=True, help="another otel-gil checkout to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--polls", type=int, default=300)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    modes = [("this checkout", ROOT), ("baseline", args.baseline.resolve())]
    runs: dict[str, list[dict]] = {name: [] for name, _ in modes}
    for i in range(args.rounds):
        for name, checkout in modes[i % 2:] + modes[:i % 2]:
            runs[name].append(run(os.path.abspath(args.python), checkout, args.polls))
    poll = {name: statistics.median(r["poll_ns"] for r in rs) / 1e3 for name, rs in runs.items()}
    addresses = {name: statistics.median(r["addresses"] for r in rs) for name, rs in runs.items()}
    body = f"""
`sudo .venv/bin/python bench/report_poll.py --python {args.python} --baseline {args.baseline} --rounds {args.rounds} \
--polls {args.polls}` on {results.machine()}, load average {load:.1f} at the start; the child: CPython \
{results.python_version(args.python)} free-threaded, GIL off, eight threads contending on four locks.

| collector | median poll (µs) | addresses parked on |
|---|---|---|
| baseline | {poll['baseline']:.0f} | {addresses['baseline']:.0f} |
| this checkout | {poll['this checkout']:.0f} | {addresses['this checkout']:.0f} |

One poll takes **{poll['this checkout'] / poll['baseline']:.2f}x** the baseline's (medians over {args.rounds} rounds,
each checkout's {args.polls} polls of 10 ms in a round).
"""
    results.write_section("report poll", body)
    print(body)


if __name__ == "__main__":
    main()

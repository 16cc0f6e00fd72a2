"""FastAPI requests driven in process, OpenTelemetry alone vs with otel-gil: CPU time per request,
measured so that the machine's other load cancels out.

    .venv/bin/python bench/asyncreq.py [--rounds 30] [--requests 200] [--loop uvloop] [--baseline CHECKOUT]
                                       [--processes 4]

bench/asyncload.py's app (bench/asyncload_app.py, FastAPI's OpenTelemetry instrumentation on a
TracerProvider exporting nowhere) in long-lived worker processes, one per mode at a time, each driving requests
through the ASGI app on its event loop (asyncio's, or uvloop's with ``--loop uvloop``), no socket:
  otel           OpenTelemetry alone
  otel+gil       with otel-gil (GilInstrumentor, in-process backend, its defaults)
  otel+gil-baseline  with ``--baseline``: another checkout's otel-gil (C parts built in place)
The workers take turns (never two at once): each round sends every mode a block of --requests
requests per route, modes in rotating order, and each block is timed by its thread's CPU time
(time.thread_time_ns: time it was preempted by other processes is not counted). A round's ratio
is OpenTelemetry alone's CPU per request over the mode's (the throughput bound: 97 % = 3 % more
CPU per request); the figure is the median over rounds, with the quartiles of the rounds' ratios.
A process's own layout (where ASLR put its heap and code) moves its CPU per request by about 1 %
for its whole life: two workers running the same build differed by 1.2 % over 120 rounds. So the
rounds are shared among --processes fresh workers per mode, one after another.
Writes the section "async requests in process" (with uvloop: "... on uvloop") of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import results  # noqa: E402

ROUTES = ("/hello", "/fanout")
WORKER = r"""
import asyncio, sys, time
from opentelemetry import trace
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.sdk.trace import TracerProvider
provider = TracerProvider()
trace.set_tracer_provider(provider)
if sys.argv[2] == "uvloop":
    import uvloop
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
import asyncload_app
if sys.argv[1] == "1":
    from otel_gil import GilInstrumentor
    GilInstrumentor().instrument(tracer_provider=provider, backend="inprocess")
FastAPIInstrumentor.instrument_app(asyncload_app.app, tracer_provider=provider)

async def receive():
    return {"type": "http.request", "body": b"", "more_body": False}

async def send(message):
    assert message.get("status", 200) == 200, message

async def main():
    for line in sys.stdin:
        route, n = line.split()
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
                 "scheme": "http", "path": route, "raw_path": route.encode(), "query_string": b"", "root_path": "",
                 "headers": [(b"host", b"x")], "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1)}
        t0 = time.thread_time_ns()
        for _ in range(int(n)):
            await asyncload_app.app(scope, receive, send)
        print(time.thread_time_ns() - t0, flush=True)
asyncio.run(main())
"""


class Worker:
    """One mode's process; block() runs n requests of a route there and gives its CPU ns."""

    def __init__(self, checkout: Path, gil: bool, loop: str) -> None:
        where = results.python_in(checkout)
        env = {**where["env"], "PYTHONPATH": f"{where['env']['PYTHONPATH']}:{ROOT / 'bench'}"}
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER, "1" if gil else "0", loop], cwd=where["cwd"],
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def block(self, route: str, n: int) -> int:
        self.proc.stdin.write(f"{route} {n}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"a worker ended (exit {self.proc.wait()})")
        return int(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--requests", type=int, default=200, help="per block (a mode, a route, a round)")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--baseline", type=Path, help="another otel-gil checkout (C parts built in place)")
    parser.add_argument("--processes", type=int, default=4, help="worker processes per mode, one after another")
    args = parser.parse_args()
    modes = {"otel": (ROOT, False), "otel+gil": (ROOT, True)}
    if args.baseline:
        modes["otel+gil-baseline"] = (args.baseline, True)
    us: dict[str, dict[str, list[float]]] = {m: {r: [] for r in ROUTES} for m in modes}
    names = list(modes)
    for p in range(args.processes):  # fresh workers: each process's own layout moves its CPU per request
        workers = {m: Worker(checkout, gil, args.loop) for m, (checkout, gil) in modes.items()}
        try:
            for w in workers.values():  # warm-up
                for route in ROUTES:
                    w.block(route, args.requests)
            for i in range(p * args.rounds // args.processes, (p + 1) * args.rounds // args.processes):
                for route in ROUTES:
                    for m in names[i % len(names):] + names[:i % len(names)]:
                        us[m][route].append(workers[m].block(route, args.requests) / args.requests / 1000)
                print(f"round {i + 1}/{args.rounds}: " + ", ".join(
                    f"{m} {r} {us[m][r][-1]:.0f} us" for m in modes for r in ROUTES), flush=True)
        finally:
            for w in workers.values():
                w.close()

    def rounds(m: str, r: str) -> list[float]:
        return [o / g for o, g in zip(us["otel"][r], us[m][r])]
    rows = [f"| {r} | {m} | {statistics.median(us[m][r]):.1f} | {100 * statistics.median(rounds(m, r)):.1f} % | "
            f"{results.quartiles(rounds(m, r))} |" for r in ROUTES for m in modes]
    uv = args.loop == "uvloop"
    body = "\n".join([
        f"`.venv/bin/python bench/asyncreq.py --rounds {args.rounds} --requests {args.requests}"
        f"{' --loop uvloop' if uv else ''}{f' --processes {args.processes}' if args.processes != 4 else ''}{f' --baseline {args.baseline}' if args.baseline else ''}` on "
        f"{results.machine()}. bench/asyncload_app.py's FastAPI app driven in process on "
        f"{'uvloop' if uv else 'asyncio'}'s loop, one worker process per mode taking turns; blocks of "
        f"{args.requests} requests per mode and route, {args.rounds} rounds in rotating order, each block timed by "
        f"its thread's CPU time; {args.processes} worker process(es) per mode in turn, each for an equal share "
        "of the rounds. Ratio: OpenTelemetry alone's CPU per request over the mode's, median of the "
        "rounds (their quartiles).",
        "",
        "| route | mode | CPU µs per request (median) | vs otel | quartiles over rounds |",
        "|---|---|---|---|---|",
        *rows,
    ])
    results.write_section("async requests in process" + (" on uvloop" if uv else ""), body)
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())

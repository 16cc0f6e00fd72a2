"""FastAPI on uvicorn (its asyncio loop, or uvloop's) under wrk on loopback: none vs
OpenTelemetry vs OpenTelemetry + otel-gil (in-process), side by side.

    .venv/bin/python bench/asyncload.py [--rounds 20] [--seconds 2] [--baseline CHECKOUT] [--loop uvloop]

The app (bench/asyncload_app.py) has /hello (a constant), /work (about 1 ms of pure Python
in two steps) and /fanout (three gather children, each a span of its own). Three uvicorn
servers (one process each, the asyncio loop) run side by side on 127.0.0.1, one per mode:
  none           plain uvicorn
  otel           opentelemetry-instrument (FastAPI instrumentation; traces exported nowhere:
                 OTEL_TRACES_EXPORTER=none); otel-gil off (OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=gil)
  otel+gil       the same with otel-gil on, in-process: every task step and span a charge point
  otel+gil-baseline  with ``--baseline``: the same with another checkout's otel-gil (its C parts
                 built in place), e.g. the one before contexts were followed
With ``--loop uvloop`` every server runs on uvloop's loop (``uvicorn --loop uvloop``), whose
task steps otel-gil sees through uvloop's GOT entries of PyContext_Enter/Exit before 3.14.
Load: wrk, 1 thread, 20 connections, sharing the machine's cores; each round loads every mode
and route once for a few seconds, in rotating order, and the throughput ratio is the median
over rounds of each round's own ratio. Each run also reads the server's CPU time (its threads'
/proc schedstat) before and after: CPU per request, whose ratio to OpenTelemetry alone's is
what a request costs, moved far less than req/s by other load on the machine (wrk and the other
servers share the cores). Writes the section "async http" (with uvloop: "async
http on uvloop") of bench/RESULTS.md and the raw runs to bench/out/asyncload[-uvloop].json.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "bench"))
import results  # noqa: E402
from webload import wrk  # noqa: E402

MODES = ("none", "otel", "otel+gil")
ROUTES = ("/hello", "/work", "/fanout")
PORTS = {"none": 8095, "otel": 8096, "otel+gil": 8097, "otel+gil-baseline": 8098}
BIN = Path(sys.executable).parent


def start_server(mode: str, log: Path, baseline: Path | None = None, loop: str = "asyncio") -> subprocess.Popen:
    argv = [str(BIN / "uvicorn"), "--port", str(PORTS[mode]), "--loop", loop, "--no-access-log", "asyncload_app:app"]
    checkout = baseline if mode == "otel+gil-baseline" else ROOT
    env = {**os.environ, "PYTHONPATH": str(checkout), "OTEL_SERVICE_NAME": "bench-async", "OTEL_TRACES_EXPORTER": "none",
           "OTEL_METRICS_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none", "OTEL_GIL_BACKEND": "inprocess"}
    if mode != "none":
        argv = [str(BIN / "opentelemetry-instrument"), *argv]
    if mode == "otel":
        env["OTEL_PYTHON_DISABLED_INSTRUMENTATIONS"] = "gil"
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", PORTS[mode])) == 0:
            raise RuntimeError(f"port {PORTS[mode]} is taken (a server left by an earlier run?): stop what listens there")
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, cwd=ROOT / "bench", env=env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{PORTS[mode]}/hello", timeout=2):
                return proc
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"uvicorn ({mode}) did not come up:\n{log.read_text()[-3000:]}")


def cpu_ns(pid: int) -> int:
    """CPU time the process's threads have run, ns (each thread's /proc schedstat; one gone since is left out)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=2, help="of load per mode, route and round")
    parser.add_argument("--baseline", type=Path, help="another otel-gil checkout (C parts built in place) beside")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio", help="the servers' event loop")
    args = parser.parse_args()
    modes = MODES + (("otel+gil-baseline",) if args.baseline else ())
    work = Path(tempfile.mkdtemp(prefix="otel-gil-bench-"))
    raw: dict[str, dict[str, list[dict]]] = {m: {r: [] for r in ROUTES} for m in modes}
    servers = {}
    try:
        for mode in modes:
            servers[mode] = start_server(mode, work / f"{mode}.log", args.baseline, args.loop)
            for route in ROUTES:
                wrk(PORTS[mode], route, 2, connections=20)  # warm-up
        logged = (work / "otel+gil.log").read_text()
        if "no GIL figures" in logged or "cannot be followed" in logged:  # otel-gil's warnings (its one log line each)
            raise RuntimeError(f"otel+gil: otel-gil has no figures:\n{logged[-2000:]}")
        for i in range(args.rounds):
            for mode in modes[i % len(modes):] + modes[:i % len(modes)]:
                for route in ROUTES:
                    before = cpu_ns(servers[mode].pid)
                    run = wrk(PORTS[mode], route, args.seconds, connections=20)
                    run["cpu_us"] = (cpu_ns(servers[mode].pid) - before) / run["requests"] / 1000
                    raw[mode][route].append(run)
            print(f"round {i + 1}/{args.rounds}: " + ", ".join(
                f"{m} {r} {raw[m][r][-1]['rps']:.0f}/s" for m in modes for r in ROUTES), flush=True)
    finally:
        for server in servers.values():
            server.terminate()
            server.wait(30)
    results.OUT.mkdir(exist_ok=True)
    uv = args.loop == "uvloop"
    (results.OUT / f"asyncload{'-uvloop' if uv else ''}.json").write_text(json.dumps(raw, indent=1))
    med = {m: {r: {k: statistics.median(run[k] for run in raw[m][r]) for k in ("rps", "cpu_us", "p50_ms", "p99_ms")}
               for r in ROUTES} for m in modes}

    def rounds(mode: str, route: str, key: str) -> list[float]:
        """Each round's ratio to OpenTelemetry alone (req/s: mode over otel; CPU: otel over mode)."""
        pairs = zip(raw[mode][route], raw["otel"][route])
        return [m["rps"] / o["rps"] if key == "rps" else o["cpu_us"] / m["cpu_us"] for m, o in pairs]

    def ratio(mode: str, key: str = "rps") -> dict[str, float]:
        return {r: statistics.median(rounds(mode, r, key)) for r in ROUTES}

    def met(ratios: dict[str, float]) -> str:
        return "met" if ratios["/hello"] >= 0.98 and ratios["/fanout"] >= 0.97 else "not met"

    def said(mode: str, key: str) -> str:
        return ", ".join(f"{r} **{100 * ratio(mode, key)[r]:.1f} %** ({results.quartiles(rounds(mode, r, key))})"
                         for r in ROUTES)
    lines = [
        f"`.venv/bin/python bench/asyncload.py --rounds {args.rounds} --seconds {args.seconds:g}"
        f"{' --loop uvloop' if uv else ''}` on {results.machine()}. "
        f"FastAPI on uvicorn's {'uvloop' if uv else 'asyncio'} loop (one process), one server per mode side by side, "
        f"wrk -t1 -c20 -d{args.seconds:g}s --latency on loopback (sharing the 2 cores); {args.rounds} rounds, each "
        "loading every mode and "
        "route once in rotating order; medians over rounds, and the ratio is the median of each round's own. /work is "
        "about 1 ms of pure Python in two steps, /fanout three gather children with spans of their own. Traces are "
        "exported nowhere (OTEL_TRACES_EXPORTER=none).",
        "",
        "| route | mode | req/s | vs none | vs otel | CPU µs/request | p50 ms | p99 ms |",
        "|---|---|---|---|---|---|---|---|",
        *(f"| {r} | {m} | {med[m][r]['rps']:.0f} | {med[m][r]['rps'] / med['none'][r]['rps']:.3f}x | "
          f"{med[m][r]['rps'] / med['otel'][r]['rps']:.3f}x | {med[m][r]['cpu_us']:.0f} | {med[m][r]['p50_ms']:.2f} | "
          f"{med[m][r]['p99_ms']:.2f} |" for r in ROUTES for m in modes),
        "",
        "otel-gil's throughput on top of OpenTelemetry, in-process (median of the rounds' ratios, their "
        "quartiles in brackets): " + said("otel+gil", "rps") + ". By the server's CPU time per request "
        "(its threads' schedstat over each wrk run, divided by the requests served: time preempted by other "
        "load is not counted, but how many requests a loop iteration batches still moves it): "
        + said("otel+gil", "cpu_us")
        + f" (targets /hello ≥ 98 %, /fanout ≥ 97 %: {met(ratio('otel+gil', 'cpu_us'))} by CPU time).",
    ]
    if args.baseline:
        lines.append(f"\nWith {args.baseline}'s otel-gil (`--baseline`, side by side), by req/s: "
                     + said("otel+gil-baseline", "rps") + "; by CPU time: " + said("otel+gil-baseline", "cpu_us") + ".")
    body = "\n".join(lines)
    results.write_section("async http on uvloop" if uv else "async http", body)
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())

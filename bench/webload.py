"""gunicorn + Flask under wrk on loopback: none vs OpenTelemetry vs OpenTelemetry + otel-gil (either backend).

    sudo .venv/bin/python bench/webload.py [--rounds 20] [--seconds 2]

The app (bench/webload_app.py) has /hello (a constant) and /work (~2 ms of pure-Python
work). Four gunicorn servers (2 sync workers each) run side by side on 127.0.0.1,
one per mode; an idle one costs nothing:
  none           plain gunicorn
  otel           opentelemetry-instrument (Flask instrumentation; traces exported
                 nowhere: OTEL_TRACES_EXPORTER=none, so spans are made and ended but
                 the exporter's cost does not drown the comparison); otel-gil off
                 (OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=gil)
  otel+gil-inprocess  the same with otel-gil on, in-process backend
                 (OTEL_GIL_BACKEND=inprocess): GOT hooks in every worker
  otel+gil-collector  otel-gil on, collector backend: every worker registers,
                 every hand-off is traced by uprobes; every span gets gil.*
Load: wrk, 1 thread, 8 connections, --latency, sharing the machine's cores. The
machine's speed drifts by more than the effect measured here within a minute, so
each round loads every mode and route once for a few seconds, in rotating
order, and the loss is the median over rounds of each round's own ratio.
Last, GIL acquisitions per /hello request: `otel-gil report`'s capture on each
worker of the otel+gil-collector server while a client sends one request at a time.
Writes the section "http" of bench/RESULTS.md and the raw runs to bench/out/webload.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
import results  # noqa: E402
import stack  # noqa: E402

from otel_gil_collector import report  # noqa: E402

MODES = ("none", "otel", "otel+gil-inprocess", "otel+gil-collector")
ROUTES = ("/hello", "/work")
PORTS = {"none": 8091, "otel": 8092, "otel+gil-inprocess": 8093, "otel+gil-collector": 8094}
BACKEND = {"otel+gil-inprocess": "inprocess", "otel+gil-collector": "collector"}
BIN = Path(sys.executable).parent


def start_server(mode: str, sock: str, log: Path) -> subprocess.Popen:
    argv = [str(BIN / "gunicorn"), "-b", f"127.0.0.1:{PORTS[mode]}", "-w", "2", "-k", "sync", "webload_app:app"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OTEL_SERVICE_NAME": "bench-http", "OTEL_TRACES_EXPORTER": "none",
           "OTEL_METRICS_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none", "OTEL_GIL_SOCKET": sock}
    if mode != "none":
        argv = [str(BIN / "opentelemetry-instrument"), *argv]
    if mode == "otel":
        env["OTEL_PYTHON_DISABLED_INSTRUMENTATIONS"] = "gil"
    if mode in BACKEND:
        env["OTEL_GIL_BACKEND"] = BACKEND[mode]
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
    raise RuntimeError(f"gunicorn ({mode}) did not come up:\n{log.read_text()[-3000:]}")


def wrk(port: int, route: str, seconds: float, connections: int = 8) -> dict:
    """One wrk run on 127.0.0.1:``port``: req/s, requests, p50 and p99 (ms)."""
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency", f"http://127.0.0.1:{port}{route}"],
                         capture_output=True, text=True, check=True).stdout
    if "Non-2xx" in out or "Socket errors" in out:
        raise RuntimeError(f"wrk saw errors:\n{out}")

    def latency_ms(label: str) -> float:
        value, unit = re.search(rf"^\s+{label}\s+([\d.]+)(us|ms|s)\s*$", out, re.M).groups()
        return float(value) * {"us": 1e-3, "ms": 1, "s": 1e3}[unit]

    return {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
            "requests": int(re.search(r"(\d+) requests in", out).group(1)),
            "p50_ms": latency_ms("50%"), "p99_ms": latency_ms("99%")}


def acquisitions_per_request(server: subprocess.Popen, seconds: float) -> float:
    """GIL acquisitions per /hello request in ``server``'s workers, requests sent one at a time.

    The workers are captured one after the other (bcc compiles one program at a
    time per process); each worker's acquisitions count against all requests sent
    in its own capture window, so the shares the workers served add up to one.
    """
    workers = [int(pid) for pid in Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split()]
    served: list[int] = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            with urllib.request.urlopen(f"http://127.0.0.1:{PORTS['otel+gil-collector']}/hello", timeout=5) as reply:
                reply.read()
            served.append(time.monotonic_ns())

    sender = threading.Thread(target=client)
    sender.start()
    try:
        captures = [report.capture(pid, seconds, lambda _: None).report for pid in workers]
    finally:
        stop.set()
        sender.join()
    per_request = 0.0
    for c in captures:
        first, last = c["start_ns"], c["start_ns"] + int(c["duration_s"] * 1e9)
        per_request += sum(t["acquisitions"] for t in c["threads"]) / sum(first <= t <= last for t in served)
    return per_request


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=2, help="of load per mode, route and round")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="otel-gil-bench-"))
    sock = str(work / "gil.sock")
    collector = stack.start_collector(sock, work / "collector.log")
    raw: dict[str, dict[str, list[dict]]] = {m: {r: [] for r in ROUTES} for m in MODES}
    servers = []
    try:
        for mode in MODES:
            before = collector.log_text().count("registered:")
            servers.append(start_server(mode, sock, work / f"{mode}.log"))
            for route in ROUTES:
                wrk(PORTS[mode], route, 2)  # warm-up: every worker has served, registered and imported all
            gil_on, deadline = mode == "otel+gil-collector", time.monotonic() + 10
            while (registered := collector.log_text().count("registered:") - before) < 2 and gil_on and time.monotonic() < deadline:
                time.sleep(0.2)
            if (registered >= 2) != gil_on:  # both workers (and the master, before it forked)
                raise RuntimeError(f"{mode}: {registered} processes registered with the collector")
            if "no GIL figures" in (work / f"{mode}.log").read_text():
                raise RuntimeError(f"{mode}: otel-gil has no figures:\n{(work / f'{mode}.log').read_text()[-2000:]}")
        for i in range(args.rounds):
            for mode in MODES[i % len(MODES):] + MODES[:i % len(MODES)]:
                for route in ROUTES:
                    raw[mode][route].append(wrk(PORTS[mode], route, args.seconds))
            print(f"round {i + 1}/{args.rounds}: " + ", ".join(
                f"{m} {r} {raw[m][r][-1]['rps']:.0f}/s" for m in MODES for r in ROUTES), flush=True)
        per_request = acquisitions_per_request(servers[MODES.index("otel+gil-collector")], 5)
    finally:
        for server in servers:
            server.terminate()
            server.wait(30)
        collector.stop()
    results.OUT.mkdir(exist_ok=True)
    (results.OUT / "webload.json").write_text(json.dumps({"runs": raw, "acquisitions_per_request": per_request}, indent=1))
    med = {m: {r: {k: statistics.median(run[k] for run in raw[m][r]) for k in ("rps", "p50_ms", "p99_ms")}
               for r in ROUTES} for m in MODES}
    lines = [
        f"`sudo .venv/bin/python bench/webload.py --rounds {args.rounds} --seconds {args.seconds:g}` on {results.machine()}. "
        f"gunicorn 2 sync workers + Flask, one server per mode side by side, wrk -t1 -c8 -d{args.seconds:g}s --latency "
        f"on loopback (sharing the 2 cores); {args.rounds} rounds, each loading every mode and route once in rotating "
        "order; medians over rounds, and the loss is the median of each round's own ratio. /work is ~2 ms of "
        "pure-Python work. Traces are exported nowhere (OTEL_TRACES_EXPORTER=none).",
        "",
        "| route | mode | req/s | vs none | vs otel | p50 ms | p99 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for route in ROUTES:
        for m in MODES:
            v = med[m][route]
            lines.append(f"| {route} | {m} | {v['rps']:.0f} | {v['rps'] / med['none'][route]['rps']:.3f}x | "
                         f"{v['rps'] / med['otel'][route]['rps']:.3f}x | {v['p50_ms']:.2f} | {v['p99_ms']:.2f} |")
    targets = {"/hello": 1.0, "/work": 0.5}
    lines.append("")
    for mode in BACKEND:
        rounds = {r: [100 * (1 - g["rps"] / o["rps"]) for g, o in zip(raw[mode][r], raw["otel"][r])] for r in ROUTES}
        loss = {r: statistics.median(rounds[r]) for r in ROUTES}
        spread = {r: statistics.quantiles(rounds[r], n=4)[::2] if len(rounds[r]) > 1 else rounds[r] * 2 for r in ROUTES}
        lines.append(f"otel-gil's req/s loss on top of OpenTelemetry, {BACKEND[mode]} backend: " + ", ".join(
            f"{r} {loss[r]:.1f} % (rounds' quartiles {spread[r][0]:.1f} to {spread[r][1]:.1f} %; target ≤ {targets[r]:g} %: "
            f"{'met' if loss[r] <= targets[r] else 'not met'})" for r in ROUTES) + ".")
    lines += ["", f"A /hello request makes **{per_request:.1f} GIL acquisitions** in its worker (each a traced hand-off; "
              "`otel-gil report`'s capture on both workers over 5 s, requests sent one at a time)."]
    body = "\n".join(lines)
    results.write_section("http", body)
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())

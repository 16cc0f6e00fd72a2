"""The ground-truth workload of bench/peers.py, run once per mode in its own process.

Usage: peers_workload.py MODE SECONDS [worker]
    (MODE: none, otel, otel+gil-inprocess, otel+gil-collector, gilknocker, py-spy)

Threads: a hog that every 50 ms wakes two victims (a byte on each one's pipe) and
then holds the GIL for 20 ms in a ``ctypes.PyDLL`` call, clock_nanosleep to an absolute
deadline (truth: start to deadline; waking takes some µs more, so a lower bound by that;
each victim waits from the wake-up to the burst's end; nothing else holds the GIL
for long, so the hog's hold is the GIL's busy time). With ``worker``, also a thread
pinging a pipe (os.write + os.read: two GIL hand-offs per op) whose ops/s are the
overhead measure (it keeps the GIL busy, so its runs say nothing about accuracy).
In the OpenTelemetry modes each victim wake-up is a span, and so is the hog's run.
Prints JSON: truth, ops/s, each tool's reading it can make in-process, thread ids.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import threading
import time

PERIOD_S, BURST_NS = 0.05, 20_000_000
CLOCK_MONOTONIC, TIMER_ABSTIME = 1, 1


class Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


mode, seconds, with_worker = sys.argv[1], float(sys.argv[2]), sys.argv[3:] == ["worker"]
libc = ctypes.PyDLL(None)  # calls keep the GIL
tracer = None
if mode.startswith("otel"):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    if mode.startswith("otel+gil-"):
        from otel_gil import GilInstrumentor

        GilInstrumentor().instrument(tracer_provider=provider, backend=mode[len("otel+gil-"):], register_timeout_s=30)
        assert GilInstrumentor._backend.state.status == "ok", GilInstrumentor._backend.state.detail
    tracer = provider.get_tracer("peers")
knocker = None
if mode == "gilknocker":
    from gilknocker import KnockKnock

    knocker = KnockKnock(polling_interval_micros=1000)
    knocker.start()

stop = threading.Event()
pipes = [os.pipe(), os.pipe()]
truth = {"hog_hold_ns": 0, "victim_wait_ns": [0, 0], "bursts": 0}
tids: dict[str, int] = {}
ops = [0]


def span(name: str):
    return tracer.start_as_current_span(name) if tracer else _NoSpan()


class _NoSpan:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def hog() -> None:
    tids["hog"] = threading.get_native_id()
    with span("hog"):
        next_at = time.monotonic()
        while not stop.is_set():
            woke = time.monotonic_ns()
            for _, w in pipes:
                libc.write(w, b"x", 1)
            t0 = time.monotonic_ns()
            t1 = t0 + BURST_NS
            # Sleep to an absolute end: a clock read after the call would come after the waiting
            # victims had their turn (the hog drops the GIL as soon as the call returns).
            deadline = Timespec(t1 // 10**9, t1 % 10**9)
            libc.clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, ctypes.byref(deadline), None)
            truth["hog_hold_ns"] += t1 - t0
            for i in range(2):
                truth["victim_wait_ns"][i] += t1 - woke
            truth["bursts"] += 1
            next_at += PERIOD_S
            time.sleep(max(next_at - time.monotonic(), 0))
    for _, w in pipes:
        os.write(w, b"q")


def victim(i: int) -> None:
    tids[f"victim-{i}"] = threading.get_native_id()
    while True:
        with span("wake"):
            if os.read(pipes[i][0], 1) == b"q":
                return


def worker() -> None:
    tids["worker"] = threading.get_native_id()
    r, w = os.pipe()
    while not stop.is_set():
        os.write(w, b"x")
        os.read(r, 1)
        ops[0] += 1


threads = [threading.Thread(target=f, args=a, name=n) for f, a, n in (
    (victim, (0,), "victim-0"), (victim, (1,), "victim-1"), (worker, (), "worker"), (hog, (), "hog"))
    if with_worker or n != "worker"]
print(json.dumps({"ready": os.getpid()}), flush=True)
if mode == "py-spy":
    sys.stdin.readline()  # py-spy is attached
start = time.monotonic_ns()
for t in threads:
    t.start()
time.sleep(seconds)
stop.set()
for t in threads:
    t.join()
wall_ns = time.monotonic_ns() - start
out = {"mode": mode, "wall_ns": wall_ns, "truth": truth, "ops_per_s": ops[0] / (wall_ns / 1e9), "tids": tids}
if knocker is not None:
    knocker.stop()
    out["gilknocker_contention"] = knocker.contention_metric
if mode.startswith("otel+gil-"):
    spans = exporter.get_finished_spans()
    out["otel_gil"] = {
        "hog_hold_ns": sum(s.attributes["gil.hold_ms"] for s in spans if s.name == "hog") * 1e6,
        "victim_wait_ns": [sum(s.attributes["gil.wait_ms"] for s in spans
                               if s.name == "wake" and s.attributes["thread.name"] == f"victim-{i}") * 1e6
                           for i in range(2)],
    }
print(json.dumps(out), flush=True)

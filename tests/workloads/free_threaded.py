"""otel_gil's whole life in a free-threaded process, with whether the GIL was on after each step.

Usage: python -W error::RuntimeWarning free_threaded.py SOCKET; the backend is $OTEL_GIL_BACKEND.
Spans: the two threads', and THREADS x REQUESTS requests (each with a child) made at once.
Prints one JSON document: ``gil_enabled`` after each step (import, instrument, spans, metrics,
otel-gil check, uninstrument), the finished spans, the metric points, ``otel-gil check``'s exit
code, the otel_gil modules' files, and the ground truth that no thread waited for a GIL: a thread counting while another
holds what a GIL build's GIL would be (a ``ctypes.PyDLL`` usleep) the whole time.
"""

from __future__ import annotations

import ctypes
import json
import sys
import threading
import time

_steps: dict[str, bool] = {}


def step(name: str) -> None:
    _steps[name] = sys._is_gil_enabled()


import otel_gil  # noqa: E402  (each import is a step)
from otel_gil import cli, inprocess  # noqa: E402,F401  (inprocess: the C part, otel_gil._inprocess)

step("import")

from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

HOLD_S = 0.3
THREADS, REQUESTS = 8, 100  # concurrent_spans: threads, each with REQUESTS request spans with a child each


def hold_and_count(tracer) -> dict:
    """One thread holds (PyDLL usleep) for HOLD_S while another counts: the longest pause
    between the counter's steps during the hold is what a GIL wait would have been."""
    held = threading.Event()
    done = threading.Event()
    truth: dict = {}

    def holder() -> None:
        with tracer.start_as_current_span("holder"):
            t0 = time.monotonic_ns()
            held.set()
            ctypes.PyDLL(None).usleep(int(HOLD_S * 1e6))
            truth["hold_ns"] = time.monotonic_ns() - t0
            done.set()

    def counter() -> None:
        with tracer.start_as_current_span("counter"):
            held.wait()
            last, longest, steps = time.monotonic_ns(), 0, 0
            while not done.is_set():
                now = time.monotonic_ns()
                longest, last, steps = max(longest, now - last), now, steps + 1
            truth["longest_pause_ns"], truth["steps"] = longest, steps

    threads = [threading.Thread(target=counter, name="counter"), threading.Thread(target=holder, name="holder")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return truth


def concurrent_spans(tracer) -> None:
    """Spans started and ended on THREADS threads at once, with no GIL to take turns on."""
    start = threading.Barrier(THREADS)

    def requests() -> None:
        start.wait()
        for _ in range(REQUESTS):
            with tracer.start_as_current_span("request"), tracer.start_as_current_span("child"):
                pass

    threads = [threading.Thread(target=requests, name=f"requests-{i}") for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def main() -> None:
    socket_path = sys.argv[1]
    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = otel_gil.GilInstrumentor()
    instrumentor.instrument(tracer_provider=provider, meter_provider=MeterProvider([reader]),
                            socket_path=socket_path, register_timeout_s=5)
    step("instrument")
    tracer = provider.get_tracer("free-threaded")
    truth = hold_and_count(tracer)
    concurrent_spans(tracer)
    truth["requests"] = THREADS * REQUESTS
    step("spans")
    data = reader.get_metrics_data()
    metrics = {m.name: [dict(p.attributes) | {"value": getattr(p, "value", getattr(p, "sum", None))}
                        for p in m.data.data_points]
               for rm in (data.resource_metrics if data else ()) for sm in rm.scope_metrics for m in sm.metrics}
    step("metrics")
    check = cli.main(["check", "--socket", socket_path, "--timeout", "5"])
    step("check")
    instrumentor.uninstrument()
    step("uninstrument")
    spans = [{"name": s.name, "attributes": dict(s.attributes)} for s in exporter.get_finished_spans()]
    modules = {m: sys.modules[m].__file__ for m in sorted(sys.modules) if m.split(".")[0] == "otel_gil"
               and getattr(sys.modules[m], "__file__", None)}  # where from: a checkout, a venv
    json.dump({"gil_enabled": _steps, "truth": truth, "spans": spans, "metrics": metrics, "check": check,
               "modules": modules}, sys.stdout)


if __name__ == "__main__":
    main()

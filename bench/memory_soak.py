"""Memory of an instrumented app over 1 M requests: flat, or growing with its life?

    .venv/bin/python bench/memory_soak.py [--requests 1000000] [--per-thread 100] [--samples 20]

One process, in-process backend, otel-gil's C hooks, metrics read at every sample (as a
reader would). Requests are server spans (a few µs of Python each) on 4 worker threads, each
thread ending after ``--per-thread`` requests and replaced by a new one (thread churn: 10,000
threads for 1 M requests); each worker's object holds a work list, as a pool's worker holds its
queue. Beside them an asyncio loop keeps 4 streaming spans open for the whole run (a websocket,
an SSE stream), each sending a chunk span at a time; the workers keep the loop waiting for the
GIL, so chunks hand their loop's long waits up to their stream. Exports go to an exporter that
counts and drops. At each sample: RSS, the Python objects alive, and otel-gil's own structures
(threads' owners, ended owners, start log; waits drawn; waits handed up to each stream).
Prints each sample as it is taken, then a table (bench/SOAK.md, "Memory over 1 M requests").
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import threading
import time
from typing import Optional

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind

from otel_gil import GilInstrumentor, threads, wait_spans
from otel_gil.semconv import GIL_WAIT

WORKERS, STREAMS = 4, 4
_PAGE = os.sysconf("SC_PAGE_SIZE")


class Dropped(SpanExporter):
    """Counts the spans, and the gil.wait spans, then drops them."""

    def __init__(self) -> None:
        self.spans = self.wait_spans = 0

    def export(self, spans) -> SpanExportResult:
        self.spans += len(spans)
        self.wait_spans += sum(s.name == GIL_WAIT for s in spans)
        return SpanExportResult.SUCCESS


class Worker(threading.Thread):
    """Serves ``count`` requests from the shared counter, then ends; holds a work list."""

    def __init__(self, soak: "Soak", count: int) -> None:
        super().__init__(name="worker", daemon=True)
        self.soak, self.count, self.work = soak, count, list(range(1000))

    def run(self) -> None:
        for _ in range(self.count):
            if not self.soak.take():
                return
            with self.soak.tracer.start_as_current_span("GET /item", kind=SpanKind.SERVER):
                sum(range(50))


def rss_kb() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE // 1024


class Soak:
    """The workload: ``requests`` requests, ``per_thread`` a thread, ``samples`` samples."""

    def __init__(self, requests: int, per_thread: int, samples: int) -> None:
        self.exporter, self.reader = Dropped(), InMemoryMetricReader()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.meters = MeterProvider(metric_readers=[self.reader])
        self.tracer = self.provider.get_tracer("soak")
        self.requests, self.per_thread, self.samples = requests, per_thread, samples
        self.served, self.threads = 0, 0
        self._lock = threading.Lock()
        self.done = threading.Event()
        self.streams: list = []

    def take(self) -> bool:
        with self._lock:
            if self.served >= self.requests:
                return False
            self.served += 1
            return True

    def _stream_loop(self) -> None:
        async def stream(n: int) -> None:
            with self.tracer.start_as_current_span(f"stream {n}", kind=SpanKind.SERVER) as span:
                self.streams.append(span)
                while not self.done.is_set():
                    with self.tracer.start_as_current_span("chunk"):
                        await asyncio.sleep(0.001)

        async def main() -> None:
            await asyncio.gather(*(stream(n) for n in range(STREAMS)))

        asyncio.run(main())

    def sample(self, started: float) -> dict:
        self.reader.get_metrics_data()  # a metric reader drains the start log
        gc.collect()
        memory = threads._memory
        owners = sum(len(o) for o in memory.owners.values()) if memory is not None else 0
        handed = [len(getattr(s, wait_spans._HANDED, ())) for s in list(self.streams)]
        return {"requests": self.served, "seconds": round(time.monotonic() - started, 1), "rss_kb": rss_kb(),
                "objects": len(gc.get_objects()), "threads_started": self.threads, "owners": owners,
                "ended": len(memory._ended) if memory is not None else 0, "starts": len(threads._starts),
                "drawn": len(wait_spans._drawn), "handed_max": max(handed, default=0),
                "wait_spans": self.exporter.wait_spans, "spans": self.exporter.spans}

    def run(self, on_sample=None) -> list[dict]:
        GilInstrumentor().instrument(tracer_provider=self.provider, meter_provider=self.meters, backend="inprocess")
        try:
            assert GilInstrumentor._backend.state.status == "ok", GilInstrumentor._backend.state.detail
            loop = threading.Thread(target=self._stream_loop, name="streams")
            loop.start()
            started, results = time.monotonic(), []
            every = max(self.requests // self.samples, 1)
            workers: list[Optional[Worker]] = [None] * WORKERS
            next_sample = 0
            while self.served < self.requests:
                for i, w in enumerate(workers):
                    if w is None or not w.is_alive():
                        workers[i] = Worker(self, self.per_thread)
                        workers[i].start()
                        self.threads += 1
                if self.served >= next_sample:
                    results.append(self.sample(started))
                    if on_sample:
                        on_sample(results[-1])
                    next_sample += every
                time.sleep(0.001)
            for w in workers:
                w.join()
            self.done.set()
            loop.join()
            results.append(self.sample(started))
            if on_sample:
                on_sample(results[-1])
            return results
        finally:
            self.done.set()  # (the streams end with the run, even a failed one)
            GilInstrumentor().uninstrument()


COLUMNS = ("requests", "seconds", "rss_kb", "objects", "threads_started", "owners", "ended", "starts", "drawn",
           "handed_max", "wait_spans")


def table(results: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(r[c]) for c in COLUMNS) + " |" for r in results]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--per-thread", type=int, default=100)
    parser.add_argument("--samples", type=int, default=20)
    args = parser.parse_args()
    results = Soak(args.requests, args.per_thread, args.samples).run(
        lambda r: print(" ".join(f"{c}={r[c]}" for c in COLUMNS), flush=True))
    print(table(results))
    warm = results[len(results) // 10]
    print(f"RSS from {warm['requests']} requests to the end: {warm['rss_kb']} -> {results[-1]['rss_kb']} kB "
          f"({results[-1]['rss_kb'] - warm['rss_kb']:+d}); objects {warm['objects']} -> {results[-1]['objects']}")


if __name__ == "__main__":
    sys.exit(main())

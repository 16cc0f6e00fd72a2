"""A soak: every span's GIL figures checked against their invariants while threads churn,
the process forks and otel-gil is instrumented and uninstrumented under it.

Usage: python soak.py SOCKET --seconds S [--forks] [--toggle] [--reuse-tids] [--subinterpreter]
[--tasks] [--uvloop];
prints one JSON document. OTEL_GIL_BACKEND picks the writer. Threads come and go (two loops
keeping 30 alive, each thread one span of 1-20 x (0.5 ms sleep + a little CPU)); with
--reuse-tids (root) each new thread is given the id of one that just exited where the kernel
lets it (``/proc/sys/kernel/ns_last_pid``, as CRIU restores pids); with --forks another
thread forks every 0.3 s (the child runs 4 threads with spans, checks its own spans the same
way and exits with their verdict); with --toggle, ``uninstrument`` and ``instrument`` every
0.5-1 s while threads wait; with --subinterpreter (3.12+), an isolated subinterpreter (its
own GIL) runs three busy threads through the second half, when no fork is made (CPython
3.13.0 aborts children forked while one runs threads). Metrics are read every 0.2 s: each
counter's total over its thread names may never go down, across instrument() calls too, and
must grow in the second half (after many instrument() calls). An exception in any thread
fails the run (``errors``), and so does a slot still held by a thread that is gone at the end
(``leaked_slots``).

With --tasks, a thread runs an asyncio loop with 20 requests in flight, each a span whose
code runs in steps between awaits, two ``gather`` children with spans of their own, and for
every fourth request a piece on a worker thread (``to_thread``); its spans get their own
code's figures (the context switches are charge points). With --uvloop, another thread runs
the same on uvloop's loop (it enters contexts in C: before 3.14 its GOT entries of
PyContext_Enter/Exit are hooked and restored with every instrument/uninstrument; a child
forked meanwhile inherits them hooked). No child runs a uvloop loop: libuv's global state
(its signal lock) may be held by the parent's loop thread at the fork.

Invariants of a span: with ``gil.status`` set, no ``gil.*`` figure (but the thread's waits on
a ``shared_thread``); else figures >= 0, and per thread its figures fit in its duration: on
its own thread wait + hold + the others' hold there <= duration + GRANULARITY_MS, on each
worker thread its code used (``soak.worker_threads`` of them) its wait and hold <= duration.
So wait + hold + others <= (1 + workers) x duration, and each ratio <= 1 + workers. A span
that lived through an uninstrument may have none of otel-gil's attributes (its start or end
hook was not installed), as with any instrumentation; any other span has them all. Which
spans did is counted, not timed: a span's ``soak.epoch`` is how many times the toggler had
switched before its ``Span.start`` was looked up, compared with the count when it is exported
(after its ``Span.end`` was); a span whose start time comes after an ``instrument()`` may have
looked its start up before it (the thread lost the GIL in between).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
from typing import Sequence

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from otel_gil import GilInstrumentor

FIGURES = ("gil.wait_ms", "gil.hold_ms", "gil.wait_ratio")  # on every span with figures (semconv.ALWAYS)
COUNTED = ("gil.acquisitions", "gil.convoy_waits")  # only where not 0 (semconv.WHEN_NONZERO)
SHARED_FIGURES = ("gil.wait_ms", "gil.wait_ratio", "gil.convoy_waits")  # what a shared_thread status keeps
GRANULARITY_MS = 0.05  # the clocks' reads around a span: CLOCK_MONOTONIC vs the span's wall times
KEPT = 20  # violations reported in full
COUNTERS = ("gil.wait.time", "gil.hold.time", "gil.acquisitions", "gil.convoy_waits")


def violation(span: ReadableSpan) -> str:
    """Why this span's figures are impossible ("" if they are not)."""
    a = span.attributes
    if not any(k.startswith(("gil.", "thread.")) for k in a):
        began = a["soak.epoch"]
        toggled = began % 2 or began != epoch  # uninstrumented as it began, or since
        return "" if toggled else "no otel-gil attributes, instrumented throughout"
    if "gil.status" in a:
        shown = [k for k in (*FIGURES, *COUNTED)
                 if k in a and not (a["gil.status"] == "shared_thread" and k in SHARED_FIGURES)]
        return f"status {a['gil.status']} with figures {shown}" if shown else ""
    if not all(k in a for k in FIGURES):
        return f"no status and figures missing: {sorted(set(FIGURES) - set(a))}"
    duration_ms = (span.end_time - span.start_time) / 1e6
    if min(a[k] for k in (*FIGURES, *COUNTED, "gil.others_hold_ms") if k in a) < 0:
        return "a negative figure"
    if any(a.get(k) == 0 for k in (*COUNTED, "gil.others_hold_ms")):
        return "a counter at 0 on the span"
    threads = 1 + a.get("soak.worker_threads", 0)
    used = a["gil.wait_ms"] + a["gil.hold_ms"] + a.get("gil.others_hold_ms", 0)
    if used > threads * duration_ms + GRANULARITY_MS:
        return (f"wait {a['gil.wait_ms']:.3f} + hold {a['gil.hold_ms']:.3f} + others {a.get('gil.others_hold_ms', 0):.3f} ms "
                f"> {threads} x duration {duration_ms:.3f} ms")
    if a["gil.wait_ratio"] > threads:
        return f"a ratio above {threads}"
    return ""


class Checker(SpanExporter):
    """Checks each span as it ends (SimpleSpanProcessor exports at once); keeps counts, not spans."""

    def __init__(self) -> None:
        self.spans = self.with_figures = self.unhooked = self.own = 0  # own: figures of a shared thread's span
        self.own_uvloop = 0  # of those, uvloop's
        self.statuses: dict[str, int] = {}
        self.violations: list[dict] = []
        self.violated = 0
        self._lock = threading.Lock()
        os.register_at_fork(after_in_child=self._unlock)  # another thread may hold it at the fork

    def _unlock(self) -> None:
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for span in spans:
            if span.name == "gil.wait":
                continue
            why = violation(span)
            hooked = any(k.startswith("thread.") for k in span.attributes)
            with self._lock:
                self.spans += 1
                self.unhooked += not hooked
                self.with_figures += hooked and "gil.status" not in span.attributes
                self.own += "gil.others_hold_ms" in span.attributes
                self.own_uvloop += "gil.others_hold_ms" in span.attributes and span.name.startswith("uv-")
                if "gil.status" in span.attributes:
                    status = span.attributes["gil.status"]
                    self.statuses[status] = self.statuses.get(status, 0) + 1
                if why:
                    self.violated += 1
                    if len(self.violations) < KEPT:
                        self.violations.append({"why": why, "span": span.name, "duration_ms": (span.end_time - span.start_time) / 1e6,
                                                "attributes": {k: v for k, v in span.attributes.items() if k.startswith(("gil.", "thread."))}})
        return SpanExportResult.SUCCESS


epoch = 0  # the toggler's switches so far: odd while uninstrumented


def start_span(tracer, name: str):
    """``tracer.start_as_current_span(name)``, with the epoch it began in (read before the call)."""
    return tracer.start_as_current_span(name, attributes={"soak.epoch": epoch})


def work(tracer, rounds: int, tids: list) -> None:
    tids.append(threading.get_native_id())
    with start_span(tracer, "work"):
        for _ in range(rounds):
            time.sleep(0.0005)
            sum(i * i for i in range(200))


def churn(tracer, stop: threading.Event, tids: list, reuse: bool, alive: int = 30) -> None:
    """Keep ``alive`` threads running, each one span, until stopped; with ``reuse``, each
    new thread asks the kernel for the id of one that exited."""
    running: list[threading.Thread] = []
    exited: list[int] = []
    while not stop.is_set():
        exited += [t.native_id for t in running if not t.is_alive()]
        running = [t for t in running if t.is_alive()]
        while len(running) < alive:
            if reuse and exited:
                with open("/proc/sys/kernel/ns_last_pid", "w") as f:  # the next pid is this + 1, if free
                    f.write(str(exited.pop() - 1))
            t = threading.Thread(target=work, args=(tracer, random.randint(1, 20), tids))
            t.start()
            running.append(t)
        time.sleep(0.001)
    for t in running:
        t.join()


def requests_on_a_loop(tracer, stop: threading.Event, in_flight: int = 20, loop: str = "asyncio") -> None:
    """An event loop, asyncio's or uvloop's, running ``in_flight`` requests at a time until
    stopped (see the top); uvloop's spans are named ``uv-*``."""
    import asyncio

    prefix = "uv-" if loop == "uvloop" else ""

    def cpu() -> None:
        sum(i * i for i in range(random.randint(100, 2000)))

    async def child() -> None:
        with start_span(tracer, f"{prefix}child"):
            cpu()
            await asyncio.sleep(0.0005)
            cpu()

    async def request(n: int) -> None:
        with start_span(tracer, f"{prefix}task") as span:
            for _ in range(random.randint(1, 5)):
                cpu()
                await asyncio.sleep(0.0005)
            await asyncio.gather(child(), child())
            if n % 4 == 0:
                span.set_attribute("soak.worker_threads", 1)
                await asyncio.to_thread(cpu)

    async def run() -> None:
        n = 0
        while not stop.is_set():
            await asyncio.gather(*(request(n + k) for k in range(in_flight)))
            n += in_flight

    if loop == "uvloop":
        import uvloop

        uvloop.run(run())
    else:
        asyncio.run(run())


SUBINTERPRETER = """
import threading, time
def busy():
    end = time.monotonic() + {seconds}
    while time.monotonic() < end:
        sum(i * i for i in range(2000))
        time.sleep(0.0005)
threads = [threading.Thread(target=busy) for _ in range(3)]
for t in threads:
    t.start()
for t in threads:
    t.join()
"""


def subinterpreter(seconds: float, ran: list) -> None:
    """Three busy threads in an isolated subinterpreter (its own GIL) for ``seconds``; ``ran``
    gets True once they all finished (3.12 raises a failure, 3.13+ returns it)."""
    try:
        import _interpreters as interpreters  # 3.13+
    except ImportError:
        import _xxsubinterpreters as interpreters  # 3.12: isolated (own GIL) by default too
    iid = interpreters.create()
    try:
        failure = interpreters.run_string(iid, SUBINTERPRETER.format(seconds=seconds))
    finally:
        interpreters.destroy(iid)
    if failure is not None:
        raise RuntimeError(f"the subinterpreter failed: {failure}")
    ran.append(True)


def forker(tracer, checker: Checker, stop: threading.Event, children: dict, tids: list) -> None:
    """Fork every 0.3 s from this busy process, until stopped; each child checks its own spans."""
    while not stop.wait(0.3):
        before = (checker.violated, checker.statuses.get("inconsistent", 0))
        pid = os.fork()
        if pid == 0:
            threads = [threading.Thread(target=work, args=(tracer, 10, tids)) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            os._exit(3 if (checker.violated, checker.statuses.get("inconsistent", 0)) != before or errors else 0)
        _, status = os.waitpid(pid, 0)
        children["forked"] += 1
        if status:
            children["failed"].append(status)


def toggler(instrumentor: GilInstrumentor, kwargs: dict, stop: threading.Event, toggles: list) -> None:
    """uninstrument and instrument again at random, while threads wait for the GIL."""
    global epoch
    while not stop.wait(random.uniform(0.5, 1.0)):
        epoch += 1
        instrumentor.uninstrument()
        time.sleep(random.uniform(0, 0.05))
        instrumentor.instrument(**kwargs)
        epoch += 1
        toggles[0] += 1


errors: list[str] = []  # exceptions in any thread of the workload: each fails the run


def _record(args: threading.ExceptHookArgs) -> None:
    errors.append(f"{args.thread.name if args.thread else '?'}: {args.exc_type.__name__}: {args.exc_value}")


threading.excepthook = _record


def leaked_slots(instrumentor: GilInstrumentor) -> list[int]:
    """Thread ids that hold a slot of the ring but are no thread of this process (a slot never
    freed at exit), once the kernel has let every exited thread go (1 s at most)."""
    ring = instrumentor._backend.state.ring if instrumentor._backend is not None else None
    if ring is None:
        return []
    for _ in range(100):
        tasks = {int(t) for t in os.listdir("/proc/self/task")}
        leaked = [s.tid for s in ring.threads() if s.tid not in tasks]
        if not leaked:
            break
        time.sleep(0.01)
    return leaked


def totals(reader: InMemoryMetricReader) -> dict[str, float]:
    """Each counter's value summed over its thread names."""
    out: dict[str, float] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name in COUNTERS:
                    out[metric.name] = out.get(metric.name, 0) + sum(p.value for p in metric.data.data_points)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("socket")
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--forks", action="store_true")
    parser.add_argument("--toggle", action="store_true")
    parser.add_argument("--reuse-tids", action="store_true")
    parser.add_argument("--subinterpreter", action="store_true")
    parser.add_argument("--tasks", action="store_true", help="an asyncio loop with 20 requests in flight too")
    parser.add_argument("--uvloop", action="store_true", help="a uvloop loop with 20 requests in flight too")
    args = parser.parse_args()
    checker, reader = Checker(), InMemoryMetricReader()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(checker))
    kwargs = {"tracer_provider": provider, "meter_provider": MeterProvider([reader]), "socket_path": args.socket,
              "register_timeout_s": 20}
    instrumentor = GilInstrumentor()
    instrumentor.instrument(**kwargs)
    tracer = provider.get_tracer("soak")
    stop, no_forks, children, toggles, tids = threading.Event(), threading.Event(), {"forked": 0, "failed": []}, [0], []
    helpers = [threading.Thread(target=churn, args=(tracer, stop, tids, args.reuse_tids and i == 0)) for i in range(2)]
    if args.forks:
        forks = threading.Thread(target=forker, args=(tracer, checker, no_forks, children, tids))
        helpers.append(forks)
    if args.toggle:
        helpers.append(threading.Thread(target=toggler, args=(instrumentor, kwargs, stop, toggles)))
    if args.tasks:
        helpers.append(threading.Thread(target=requests_on_a_loop, args=(tracer, stop), name="loop"))
    if args.uvloop:
        helpers.append(threading.Thread(target=requests_on_a_loop, args=(tracer, stop, 20, "uvloop"), name="uvloop"))
    for t in helpers:
        t.start()
    metric_drops, reads, first, last = [], 0, None, {}
    deadline, half, ran = time.monotonic() + args.seconds, time.monotonic() + args.seconds / 2, []
    while time.monotonic() < deadline:
        if args.subinterpreter and not no_forks.is_set() and time.monotonic() >= half:
            no_forks.set()
            if args.forks:
                forks.join()
            helpers.append(threading.Thread(target=subinterpreter, args=(deadline - time.monotonic(), ran)))
            helpers[-1].start()
        time.sleep(0.2)
        now = totals(reader)  # across instrument() calls too: the counters go on
        reads += 1
        metric_drops += [f"{name} {last[name]} -> {value}" for name, value in now.items()
                         if name in last and value < last[name]]
        last = now
        if first is None and time.monotonic() >= half:
            first = now
    stop.set()
    no_forks.set()
    for t in helpers:
        t.join()
    grown = {name: last.get(name, 0) - value for name, value in (first or {}).items()}  # in the second half
    print(json.dumps({"python": sys.version.split()[0], "backend": os.environ.get("OTEL_GIL_BACKEND", "auto"),
                      "seconds": args.seconds, "spans": checker.spans, "with_figures": checker.with_figures, "unhooked": checker.unhooked,
                      "own": checker.own, "own_uvloop": checker.own_uvloop,
                      "statuses": checker.statuses, "threads": len(tids), "tids_reused": len(tids) - len(set(tids)),
                      "subinterpreter": bool(ran), "errors": errors, "leaked_slots": leaked_slots(instrumentor),
                      "violated": checker.violated, "violations": checker.violations, "children": children,
                      "toggles": toggles[0], "metric_reads": reads, "metric_drops": metric_drops,
                      "metrics_grown": grown}))


if __name__ == "__main__":
    main()

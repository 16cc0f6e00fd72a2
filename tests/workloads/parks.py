"""Parked time on a free-threaded build (its GIL off), against ground truths measured here.

Usage: python parks.py SCENARIO HOLD_MS; the in-process backend (``PARKS_WITHOUT_CHARGE_POINTS=1``:
without ``otel_gil._parkcontexts``). Prints one JSON document: the
finished spans (name, attributes, events), the scenario's truth (monotonic ns), whether parks were
hooked, and the ``cpython.parked.time`` counter by kind at the end (s, summed over thread names). Each scenario runs a victim span on one thread while another thread keeps
something from it:

- ``critical_section``: a thread sorts a shared list with a key that stays attached for HOLD_MS
  (a ``ctypes.PyDLL`` usleep: the list's critical section held); the victim appends to it.
- ``stop_the_world``: a thread runs ``gc.collect()`` over a large heap while the victim counts;
  the victim's longest pause between two steps holds the pause it was suspended for, and is that
  pause unless the kernel preempted the victim in it (its involuntary context switches, counted:
  on a loaded machine it may be off the CPU before it reaches the point where it parks).
- ``app_lock``, ``rlock``: a thread holds a ``threading.Lock`` (``RLock``) for HOLD_MS; the
  victim acquires it.
- ``fork``: ``app_lock``, then ``app_lock`` again in a forked child (its truth and victim span).
- ``soak``: 8 threads, and 20 tasks on a loop (some parts in ``asyncio.to_thread``), make spans
  sharing a list, a dict and a lock for HOLD_MS (no victim).
- ``loop``: on an asyncio loop, another request's code (its span ``blocked``) blocks the loop's
  thread on a lock a thread holds for HOLD_MS while the victim's span is in flight: the park is
  ``blocked``'s, not the victim's.
- ``to_thread``: the same, ``blocked`` waiting in ``asyncio.to_thread`` (a worker thread running
  its context).
- ``uvicorn``: the same on a real uvicorn server (``--loop asyncio --http h11``, the app under
  OpenTelemetry's ASGI middleware): ``GET /blocked`` waits for the lock while ``GET /victim`` is
  in flight on the same loop.
- ``reinstrumented``: a victim span in flight across ``uninstrument()``/``instrument()`` waits for a
  lock held HOLD_MS; then a span started after (``after``) does.
- ``greenlets``: the same between two greenlets of one thread (run with ``PYTHON_GIL=0``: greenlet's
  module does not declare ``Py_mod_gil``, and importing it would turn the GIL on).
"""

from __future__ import annotations

import asyncio
import contextvars
import ctypes
import gc
import json
import os
import resource
import sys
import threading
import time

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

if os.environ.get("PARKS_WITHOUT_CHARGE_POINTS"):  # as an sdist built without a compiler would have it
    sys.modules["otel_gil._parkcontexts"] = None
from otel_gil import parks  # noqa: E402
from otel_gil.instrumentor import GilInstrumentor  # noqa: E402

_exporter = InMemorySpanExporter()
_provider = TracerProvider()
_usleep = ctypes.PyDLL(None).usleep  # PyDLL: the caller stays attached, holding what it holds


def critical_section(tracer, hold_ms: int) -> dict:
    shared, started = list(range(1000)), threading.Event()

    def key(x: int) -> int:
        if x == 0:
            started.set()
            _usleep(hold_ms * 1000)
        return x

    sorter = threading.Thread(target=lambda: shared.sort(key=key))
    sorter.start()
    started.wait()
    with tracer.start_as_current_span("victim"):
        t0 = time.monotonic_ns()
        shared.append(1)
        t1 = time.monotonic_ns()
    sorter.join()
    return {"waited_ns": t1 - t0}


def stop_the_world(tracer, hold_ms: int) -> dict:
    heap = [[i, str(i)] for i in range(hold_ms * 5000)]  # containers the collection visits
    collecting, done, truth = threading.Event(), threading.Event(), {}

    def collect() -> None:
        collecting.wait()
        truth["collect_start_ns"] = time.monotonic_ns()
        gc.collect()
        truth["collect_end_ns"] = time.monotonic_ns()
        done.set()

    collector = threading.Thread(target=collect)
    collector.start()
    def step() -> tuple[int, int]:  # now, and this thread's involuntary context switches so far
        return time.monotonic_ns(), resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw

    with tracer.start_as_current_span("victim"):
        last, longest = step(), (0, 0, 0)
        collecting.set()
        while True:
            stopped = done.is_set()  # the last step after it is set still sees a pause before it
            now = step()
            if now[0] - last[0] > longest[1] - longest[0]:
                longest = (last[0], now[0], now[1] - last[1])
            last = now
            if stopped:
                break
    collector.join()
    del heap
    truth["pause_start_ns"], truth["pause_end_ns"], truth["pause_preempted"] = longest
    return truth


def lock_held(tracer, hold_ms: int, lock) -> dict:
    lock, holder = held_lock(hold_ms, lock)
    with tracer.start_as_current_span("victim"):
        t0 = time.monotonic_ns()
        with lock:
            t1 = time.monotonic_ns()
    holder.join()
    return {"waited_ns": t1 - t0}


def soak(tracer, seconds_ms: int) -> dict:
    """8 threads and 20 tasks on a loop making spans that share a list, a dict and a lock, with
    collections now and then."""
    shared, table, lock, stop = [], {}, threading.Lock(), time.monotonic() + seconds_ms / 1000

    def work(n: int) -> None:
        while time.monotonic() < stop:
            with tracer.start_as_current_span("request"):
                shared.append(n)
                table[n % 64] = list(table)
                with lock:
                    shared.sort()
                    if n % 11 == 0:
                        time.sleep(0.002)  # a hold the others surely park on (a busy machine's spins may not)
                if n % 97 == 0:
                    gc.collect()
                n += 8

    async def request(n: int) -> None:  # on a loop: the spans' own parks, charged at each task switch
        while time.monotonic() < stop:
            with tracer.start_as_current_span("request", attributes={"loop": True}):
                shared.append(n)
                with lock:
                    shared.sort()
                await asyncio.sleep(0)
                if n % 3 == 0:
                    await asyncio.to_thread(lambda: table.update({n % 64: list(table)}))
            n += 20

    async def serve() -> None:
        await asyncio.gather(*(request(i) for i in range(20)))

    workers = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    workers.append(threading.Thread(target=asyncio.run, args=(serve(),)))
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    return {}


def forked(tracer, hold_ms: int) -> dict:
    """A parked span in the parent, then ``app_lock`` in a forked child (its slots started afresh):
    the child's victim span and truth."""
    lock_held(tracer, hold_ms, threading.Lock())
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        _exporter.clear()
        truth = lock_held(tracer, hold_ms, threading.Lock())
        (span,) = [s for s in _exporter.get_finished_spans() if s.name == "victim"]
        os.write(write, json.dumps({"truth": truth, "attributes": dict(span.attributes)}).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as child:
        answer = json.loads(child.read())
    os.waitpid(pid, 0)
    return answer


def held_lock(hold_ms: int, lock=None) -> tuple[threading.Lock, threading.Thread]:
    """``lock`` (a new ``threading.Lock`` if None) held by a thread for hold_ms from now (the thread, to join)."""
    lock, holding = threading.Lock() if lock is None else lock, threading.Event()

    def hold() -> None:
        with lock:
            holding.set()
            time.sleep(hold_ms / 1000)

    holder = threading.Thread(target=hold)
    holder.start()
    holding.wait()
    return lock, holder


def wait_for(lock: threading.Lock, truth: dict) -> None:
    """Take and drop the lock (blocking this thread: it parks), timing the wait into truth."""
    t0 = time.monotonic_ns()
    with lock:
        truth["waited_ns"] = time.monotonic_ns() - t0


RESUMED_S = 0.03  # how long the request that waits sleeps first (its wait is in a later step)


async def ticking(tracer, seconds: float) -> None:
    """The victim's code: a child span every 5 ms (each a charge point that leaves the victim's
    code running on the thread: a park in a later step of another task is not the victim's only
    because that step's switch is seen)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        await asyncio.sleep(0.005)
        with tracer.start_as_current_span("tick"):
            pass


def loop(tracer, hold_ms: int, worker: bool = False) -> dict:
    truth: dict = {}

    async def victim() -> None:
        with tracer.start_as_current_span("victim"):
            await ticking(tracer, 2 * hold_ms / 1000)

    async def other() -> None:
        await asyncio.sleep(0.01)
        with tracer.start_as_current_span("blocked"):
            await asyncio.sleep(RESUMED_S)
            if worker:  # a worker thread runs it in the request's context
                await asyncio.to_thread(wait_for, lock, truth)
            else:
                wait_for(lock, truth)  # blocks the loop's thread: it parks, in this request's code

    async def both() -> None:
        await asyncio.gather(victim(), other())

    lock, holder = held_lock(hold_ms + 100)  # (its wait starts later)
    asyncio.run(both())
    holder.join()
    return truth


def served(tracer, hold_ms: int) -> dict:
    """``GET /victim`` and ``GET /blocked`` on one uvicorn server's loop, the second waiting for the lock."""
    import http.client

    import uvicorn
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware

    truth: dict = {}
    started = threading.Event()

    async def app(scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/victim":
            started.set()
            await ticking(tracer, 2 * hold_ms / 1000)
        else:
            await asyncio.sleep(RESUMED_S)
            wait_for(lock, truth)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    config = uvicorn.Config(OpenTelemetryMiddleware(app, tracer_provider=_provider), host="127.0.0.1", port=0,
                            loop="asyncio", http="h11", lifespan="off", log_level="warning")
    server = uvicorn.Server(config)
    serving = threading.Thread(target=server.run)
    serving.start()
    while not server.started:
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]

    def get(path: str) -> None:
        client = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        client.request("GET", path)
        assert client.getresponse().read() == b"ok"

    victim = threading.Thread(target=get, args=("/victim",))
    victim.start()
    started.wait()
    lock, holder = held_lock(hold_ms + 100)  # (its wait starts later)
    get("/blocked")
    victim.join()
    holder.join()
    server.should_exit = True
    serving.join()
    return truth


def greenlets(tracer, hold_ms: int) -> dict:
    """The other greenlet starts its span and switches back to the hub, the victim's starts its
    own and switches back; the other's, switched to again, waits for the lock (a park the victim's
    is not charged only because that switch is seen) and ends its span; then the victim's."""
    import greenlet

    truth: dict = {}

    def victim() -> None:
        with tracer.start_as_current_span("victim"):
            hub.switch()

    def other() -> None:
        with tracer.start_as_current_span("blocked"):
            hub.switch()
            wait_for(lock, truth)

    hub = greenlet.getcurrent()
    with tracer.start_as_current_span("warm-up"):  # the thread's first span sets its greenlet tracer
        pass
    first, second = greenlet.greenlet(victim), greenlet.greenlet(other)
    lock, holder = held_lock(hold_ms)
    second.switch()
    first.switch()
    second.switch()
    first.switch()
    holder.join()
    return truth


def reinstrumented(tracer, hold_ms: int) -> dict:
    """A span in flight across uninstrument() and instrument() (its charges stopped meanwhile) that
    then waits for a lock: ``victim``; a span started after, waiting again: ``after``."""
    lock, holder = held_lock(hold_ms)
    with tracer.start_as_current_span("victim"):
        GilInstrumentor().uninstrument()
        GilInstrumentor().instrument(tracer_provider=_provider, backend="inprocess")
        victim: dict = {}
        wait_for(lock, victim)
    holder.join()
    lock, holder, truth = *held_lock(hold_ms), {"victim_waited_ns": victim["waited_ns"]}
    with tracer.start_as_current_span("after"):
        wait_for(lock, truth)
    holder.join()
    return truth


SCENARIOS = {
    "reinstrumented": reinstrumented,
    "fork": forked,
    "loop": loop,
    "to_thread": lambda tracer, hold_ms: loop(tracer, hold_ms, worker=True),
    "uvicorn": served,
    "greenlets": greenlets,
    "soak": soak,
    "critical_section": critical_section,
    "stop_the_world": stop_the_world,
    "app_lock": lambda tracer, hold_ms: lock_held(tracer, hold_ms, threading.Lock()),
    "rlock": lambda tracer, hold_ms: lock_held(tracer, hold_ms, threading.RLock()),
}


def main() -> None:
    scenario, hold_ms = sys.argv[1], int(sys.argv[2])
    exporter, provider = _exporter, _provider
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    GilInstrumentor().instrument(tracer_provider=provider, meter_provider=MeterProvider([reader]), backend="inprocess")
    hooked, contexts = parks.current is not None, parks.contexts
    run_instrumented = type(contextvars.Context.__dict__["run"]).__name__  # ContextRun where charge points are
    truth = SCENARIOS[scenario](provider.get_tracer("parks"), hold_ms)
    parked: dict = {}  # by kind, summed over thread names
    for point in (p for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics
                  for m in sm.metrics if m.name == "cpython.parked.time" for p in m.data.data_points):
        kind = point.attributes["cpython.park.kind"]
        parked[kind] = parked.get(kind, 0) + point.value
    GilInstrumentor().uninstrument()
    run = type(contextvars.Context.__dict__["run"]).__name__  # the builtin's again
    spans = [{"name": s.name, "attributes": dict(s.attributes), "duration_ns": s.end_time - s.start_time,
              "events": [{"name": e.name, "attributes": dict(e.attributes), "time": e.timestamp} for e in s.events]}
             for s in exporter.get_finished_spans()]
    print(json.dumps({"hooked": hooked, "contexts": contexts, "context_run": run,
                      "context_run_instrumented": run_instrumented, "gil": sys._is_gil_enabled(), "truth": truth, "spans": spans,
                      "parked_s": parked, "wall_minus_mono": time.time_ns() - time.monotonic_ns()}))


if __name__ == "__main__":
    main()

"""Workloads with known GIL behaviour, run in their own process by the tests.

Usage: python scenarios.py SCENARIO SOCKET [options]; prints one JSON document:
the finished spans (name, attributes, events) and the ground truth the
workload measured itself.

Ground truth comes from ``ctypes.PyDLL``: a call through it keeps the GIL, so a
``usleep(B)`` made that way holds the GIL for B (measured around the call).
"""

from __future__ import annotations

import argparse
import ctypes
import dis
import functools
import json
import operator
import os
import platform
import signal
import sys
import threading
import time

from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_gil import GilInstrumentor
import own_time

_gil_holding_libc = ctypes.PyDLL(None)  # calls keep the GIL
IO_CALL_S = 100e-6  # convoy: one fast I/O call
_metric_reader = InMemoryMetricReader()
_exporter = InMemorySpanExporter()


def finished_spans() -> list[dict]:
    """The spans ended so far, as the report lists them."""
    return [
        {
            "name": s.name,
            "span_id": f"{s.context.span_id:016x}",
            "parent_id": f"{s.parent.span_id:016x}" if s.parent else None,
            "end_ns": s.end_time,
            "attributes": dict(s.attributes),
            "events": [{"name": e.name, "timestamp": e.timestamp, "attributes": dict(e.attributes)} for e in s.events],
            "duration_ns": s.end_time - s.start_time,
            "start_ns": s.start_time,
        }
        for s in _exporter.get_finished_spans()
    ]


def read_metrics() -> dict:
    """{instrument: {its point's attribute values, comma-joined (a thread.name, a reason, a route and
    its le): value}} from the SDK's in-memory reader."""
    out: dict = {}
    data = _metric_reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for point in metric.data.data_points:
                    key = ",".join(str(value) for value in point.attributes.values())
                    out.setdefault(metric.name, {})[key] = getattr(point, "value", getattr(point, "sum", None))
    return out


def _clocked_hold(us: int) -> int:
    """Hold the GIL ``us`` µs (PyDLL usleep) between two clock reads: ns between them. The three
    calls are chained in C (map), with no bytecode between them where the GIL could be handed
    on: unlike around a call, the reads are inside the hold even when a thread is waiting."""
    ts = (ctypes.c_long * 4)()
    clock = functools.partial(_gil_holding_libc.clock_gettime, time.CLOCK_MONOTONIC)
    tuple(map(operator.methodcaller("__call__"), (functools.partial(clock, ctypes.byref(ts)),
          functools.partial(_gil_holding_libc.usleep, us), functools.partial(clock, ctypes.byref(ts, 16)))))
    return (ts[2] - ts[0]) * 1_000_000_000 + ts[3] - ts[1]


def _wait_gone(threads: list, timeout_s: float = 5.0) -> None:
    """Until the kernel has let these threads go: join() returns when Python is done with a
    thread, which can be before its kernel exit (where the collector folds its figures)."""
    deadline = time.monotonic() + timeout_s
    while any(os.path.exists(f"/proc/self/task/{t.native_id}") for t in threads) and time.monotonic() < deadline:
        time.sleep(0.001)


def hog_and_victim(tracer, args) -> dict:
    """A hog wakes a victim blocked in os.read, then holds the GIL for a burst.

    Each burst the victim waits from its wake-up (the hog's write) to the burst's
    end: truth = sum(burst_end - write_time), as the hog measures it.
    """
    r, w = os.pipe()
    truth = {"bursts_ns": [], "victim_wait_ns": 0}
    ready = threading.Barrier(2)
    done = threading.Barrier(3)  # with main: metrics are read while both threads still live
    release = threading.Event()

    def victim() -> None:
        with tracer.start_as_current_span("victim"):
            ready.wait()
            for _ in range(args.bursts):
                os.read(r, 1)
        done.wait()
        release.wait()

    def hog() -> None:
        with tracer.start_as_current_span("hog"):
            ready.wait()
            time.sleep(0.05)
            code = sys._getframe().f_code
            for _ in range(args.bursts):
                t_write = time.monotonic_ns()
                _gil_holding_libc.write(w, b"x", 1)
                t0, line = time.monotonic_ns(), sys._getframe().f_lineno + 1
                _gil_holding_libc.usleep(args.burst_ms * 1000)  # the hold ends right after: its location
                t1 = time.monotonic_ns()
                truth["bursts_ns"].append(t1 - t0)
                truth["victim_wait_ns"] += t1 - t_write
                truth["hog_code"] = [getattr(code, "co_qualname", code.co_name), code.co_filename, line]
                time.sleep(args.gap_ms / 1000)
        done.wait()
        release.wait()

    threads = [threading.Thread(target=victim, name="victim"), threading.Thread(target=hog, name="gil-hog")]
    for t in threads:
        t.start()
    done.wait()
    truth["metrics_alive"] = read_metrics()
    release.set()
    for t in threads:
        t.join()
    _wait_gone(threads)
    truth["metrics_exited"] = read_metrics()

    def flusher() -> None:  # lives and exits between two reads
        t0 = time.monotonic_ns()
        _gil_holding_libc.usleep(args.burst_ms * 1000)
        truth["flusher_hold_ns"] = time.monotonic_ns() - t0

    flush = threading.Thread(target=flusher, name="flusher")
    flush.start()
    flush.join()
    _wait_gone([flush])
    truth["metrics_flushed"] = read_metrics()
    truth["switch_interval_ms"] = sys.getswitchinterval() * 1000  # the wait spans' default threshold
    truth["spin_code"] = _pure_python_holder(tracer)
    return truth


def _pure_python_holder(tracer, seconds: float = 0.3) -> list:
    """A thread in a pure-Python loop (_spin) keeps the GIL until forced to drop it, while
    another, in a span "py-victim", sleeps 2 ms at a time and waits a switch interval after
    each: the waits' blocker held the GIL in _spin, at one of its lines (truth: [qualname,
    file, lines])."""
    started = threading.Event()

    def spinner() -> None:
        started.set()
        _spin(seconds)

    def victim() -> None:
        started.wait()
        with tracer.start_as_current_span("py-victim"):
            deadline = time.monotonic() + seconds * 0.8
            while time.monotonic() < deadline:
                time.sleep(0.002)

    threads = [threading.Thread(target=spinner, name="py-hog"), threading.Thread(target=victim, name="py-victim")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    code = _spin.__code__
    return [getattr(code, "co_qualname", code.co_name), code.co_filename,
            sorted({line for _, line in dis.findlinestarts(code) if line and line > code.co_firstlineno})]


def convoy(tracer, args) -> dict:
    """Beazley's issue 7946: an I/O thread's every call waits for a CPU-bound thread.

    Each I/O call takes 0.1 ms (a fast backend), long enough for the CPU-bound
    thread to wake and take the released GIL, so the I/O thread must wait out a
    switch interval to get it back. (With reads that return at once, the reader
    wins the race for the GIL it just released as often as not, and how often
    depends on the machine: CI once saw 1 convoy in 100 reads.)
    """
    stop = threading.Event()

    def cpu() -> None:
        n = 0
        while not stop.is_set():
            n += 1

    def io() -> None:
        with tracer.start_as_current_span("io"):
            for _ in range(args.reads):
                time.sleep(IO_CALL_S)  # releases the GIL, like any blocking I/O

    spinner = threading.Thread(target=cpu, name="cpu-bound")
    reader = threading.Thread(target=io, name="io-reader")
    spinner.start()
    time.sleep(0.02)
    reader.start()
    reader.join()
    stop.set()
    spinner.join()
    return {"reads": args.reads, "switch_interval_ms": sys.getswitchinterval() * 1000}


def _spin(seconds: float) -> None:
    """Pure Python for about ``seconds`` of wall time (keeps the GIL unless forced off)."""
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        pass


def requests(tracer, args) -> dict:
    """A pure-Python CPU-bound thread among request threads: the convoy users meet.

    Each of ``--io-threads`` threads serves ``--requests`` requests, each a span of
    10 x (1 ms of I/O + ~0.2 ms of Python). The request threads hand the GIL to
    one another all the time, but the one that keeps it is the CPU-bound thread.
    """
    stop = threading.Event()
    ready = threading.Barrier(args.io_threads + 1)

    def cpu() -> None:
        with tracer.start_as_current_span("hog"):
            ready.wait()
            while not stop.is_set():
                pass

    def serve() -> None:
        ready.wait()
        for _ in range(args.requests):
            with tracer.start_as_current_span("request"):
                for _ in range(10):
                    time.sleep(0.001)
                    _spin(0.0002)

    hog = threading.Thread(target=cpu, name="cpu-hog")
    servers = [threading.Thread(target=serve, name=f"request-{i}") for i in range(args.io_threads)]
    hog.start()
    for t in servers:
        t.start()
    for t in servers:
        t.join()
    stop.set()
    hog.join()
    return {"io_threads": args.io_threads, "requests": args.requests}


def switches(tracer, args) -> dict:
    """Two pure-Python CPU-bound threads and nothing else: each runs until forced to
    drop the GIL, then waits for it while the other runs. Truth: a thread always
    either holds the GIL or wants it, so its hold + wait = its span's length, and its
    CPU time (time.thread_time_ns) is about its hold."""
    ready = threading.Barrier(2)
    cpu_ns: dict = {}
    tids: dict = {}

    def spin(name: str) -> None:
        tids[name] = threading.get_native_id()
        ready.wait()
        with tracer.start_as_current_span(name):
            c0 = time.thread_time_ns()
            _spin(args.seconds)
            cpu_ns[name] = time.thread_time_ns() - c0

    threads = [threading.Thread(target=spin, args=(n,), name=n) for n in ("spinner-a", "spinner-b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"cpu_ns": cpu_ns, "tids": tids, "switch_interval_ms": sys.getswitchinterval() * 1000}


def _runqueue_ns() -> int:
    """How long the calling thread was runnable but not running so far (the kernel's schedstat)."""
    with open("/proc/thread-self/schedstat") as f:
        return int(f.read().split()[1])


def syscalls(tracer, args) -> dict:
    """One thread, no contention: os.stat and os.read release and re-take the GIL (on
    LTO builds through inlined copies of drop_gil), a PyDLL usleep holds it for a known
    time. Truth: 2 acquisitions per iteration; hold = the usleeps (measured) + a little
    Python in between, at most the thread's CPU time outside the usleeps (the collector's
    probes are its system time) plus its time preempted (the kernel's run queue)."""
    fd = os.open("/dev/zero", os.O_RDONLY)
    held = slept_cpu = 0
    cpu0, queued0 = time.thread_time_ns(), _runqueue_ns()  # outside the span: reading a file releases the GIL
    with tracer.start_as_current_span("syscalls"):
        for _ in range(args.iterations):
            os.stat("/")
            os.read(fd, 1)
            t0, c0 = time.monotonic_ns(), time.thread_time_ns()
            _gil_holding_libc.usleep(args.hold_us)  # its wake-up costs CPU too (tens of us)
            held += time.monotonic_ns() - t0
            slept_cpu += time.thread_time_ns() - c0
    between = time.thread_time_ns() - cpu0 - slept_cpu + _runqueue_ns() - queued0
    os.close(fd)
    return {"acquisitions": 2 * args.iterations, "usleep_hold_ns": held, "between_ns": between}


def churn(tracer, args) -> dict:
    """Many short threads (tids get reused): each holds the GIL 100 us inside its span."""
    def work() -> None:
        with tracer.start_as_current_span("short") as span:
            t0 = time.monotonic_ns()
            _gil_holding_libc.usleep(100)
            span.set_attribute("truth.hold_ns", time.monotonic_ns() - t0)

    for _ in range(args.threads // args.batch):
        batch = [threading.Thread(target=work) for _ in range(args.batch)]
        for t in batch:
            t.start()
        for t in batch:
            t.join()
    ring = GilInstrumentor._backend.state.ring
    return {"threads": args.threads, "slot_overflows": ring.header.slot_overflows if ring else None}


def _other_threads_off_the_gil(timeout_s: float = 10.0) -> None:
    """Wait until no other thread of this process waits on a futex (the GIL's condition
    variable is one): a fork with no CPython at-fork reinit (uWSGI's default) copies a waiter
    count into the child's GIL condition variable, whose next signal then waits for good
    (glibc quiesces waiters that do not exist there), otel-gil or not. uWSGI forks before
    threads start; here the collector backend's registrar may still be finishing its work."""
    me, deadline = threading.get_native_id(), time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        waiting = [tid for tid in os.listdir("/proc/self/task") if int(tid) != me
                   and "futex" in open(f"/proc/self/task/{tid}/wchan").read()]
        if not waiting:
            return
        time.sleep(0.01)
    raise RuntimeError(f"threads {waiting} still wait on a futex: a C fork now could hang the child")


def cfork(tracer, args) -> dict:
    """A fork made by C code, as uWSGI makes its workers (here libc's fork through PyDLL,
    the GIL held): no Python at-fork hook runs in the child. The child's spans each hold
    the GIL 5 ms (truth.hold_ns) and come back through a pipe."""
    _other_threads_off_the_gil()
    r, w = os.pipe()
    pid = _gil_holding_libc.fork()
    if pid == 0:
        os.close(r)
        _exporter.clear()
        for _ in range(args.spans):
            with tracer.start_as_current_span("child") as span:
                t0 = time.monotonic_ns()
                _gil_holding_libc.usleep(5000)
                span.set_attribute("truth.hold_ns", time.monotonic_ns() - t0)
            time.sleep(0.02)
        backend = GilInstrumentor._backend
        os.write(w, json.dumps({"pid": os.getpid(), "header_pid": backend.state.ring.header.pid if backend.state.ring else None,
                                "spans": finished_spans()}).encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as pipe:
        child = json.loads(pipe.read())
    os.waitpid(pid, 0)
    return {"child": child, "child_pid": pid}


def service(tracer, args) -> dict:
    """A long-running app: a span every 20 ms, each holding the GIL 1 ms, until SIGUSR1 (at
    most ``--seconds``), so that a test can kill and restart the collector meanwhile."""
    stopped = threading.Event()
    signal.signal(signal.SIGUSR1, lambda *_: stopped.set())
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline and not stopped.is_set():
        with tracer.start_as_current_span("tick"):
            _gil_holding_libc.usleep(1000)
        time.sleep(0.02)
    return {}


def tasks(tracer, args) -> dict:
    """Requests as asyncio tasks, ``args.in_flight`` at a time on one loop thread, each
    measuring its own code (the README's "Async and greenlet services"):

    0. calibration: the same requests with pieces of no length, whose code is asyncio's and
       OpenTelemetry's alone (the task steps, timers, span starts and ends), which a span
       counts and the pieces' truths do not: its share of the loop thread's CPU time per
       request (``framework_ns``) bounds what a request's span may count over its truth.
    1. own: three pure-Python pieces (6 ms), a PyDLL hold (3 ms), two ``gather`` children
       with spans of their own (a 3 ms piece each) and a ``to_thread`` PyDLL hold (6 ms, as the
       worker's slot counted it: its sleep's overshoot too) (pure Python in a worker thread would
       be forced to switch with the loop thread: its truth would rest on every such wait being
       counted); truth = their sum (a child's: its piece). The loop thread's own hold over the
       phase and the workers' holds bound their sum.
    2. waits: a hog thread outside any request holds the GIL through PyDLL, 3 ms at a time,
       while the requests yield with sleep(0) (the loop always has a task ready, so it waits
       out the hog's holds): truth of a request's wait = the loop thread's waits (its slot)
       from its span's start to its end, as read from its first step and its last.
    3. blame (with 2.): a thread outside the loop sleeps 1 ms at a time in its span, and waits
       for the GIL on each wake-up while the loop runs requests: the request whose code the
       loop ran during a wait is known from the requests' pieces (wall clock intervals).

    The loop is asyncio's, or uvloop's (``--loop uvloop``: it enters contexts in C).
    own_time.py says how a piece's truth is timed.
    """
    import asyncio

    truth: dict = {"own_ns": {}, "cpu_ns": {}, "child_ns": {}, "worker_ns": 0, "hog_ns": [], "pieces": {},
                   "loop_waits_ns": {}, "in_flight": args.in_flight}
    hog_on = threading.Event()
    stop = threading.Event()
    hog_ns: list = []

    class Own:
        """The truth (own_time) of one request's code between its awaits, and of what it did
        elsewhere or held without running (added by hand): ``ns``, and its CPU time, ``cpu_ns``."""

        def __init__(self) -> None:
            self.ns, self.cpu_ns, self.pieces = 0, 0, []

        def add(self, held: own_time.Held) -> None:
            self.ns += held.ns
            self.cpu_ns += held.cpu_ns

        def __enter__(self):  # the code from here to the next await runs in one task step
            self.start, self.wall0 = own_time.clock(), time.time_ns()
            return self

        def __exit__(self, *exc) -> None:
            self.add(own_time.since(self.start))
            self.pieces.append((self.wall0, time.time_ns()))

    async def request(i: int, name: str = "request", ms: float = 3.0, into: dict | None = None) -> None:
        """A request whose pieces last ``ms`` times their length; its truths go ``into`` a
        scratch dict (calibration) instead of ``truth``."""
        into = truth if into is None else into
        own = Own()
        with tracer.start_as_current_span(f"{name}-{i}") as span:
            for _ in range(3):
                with own:
                    own_time.spin(2 * ms)
                await asyncio.sleep(0.002)
            own.add(own_time.pydll_hold(ms))
            with own:
                gathered = asyncio.gather(child(i, 0, name, ms, into), child(i, 1, name, ms, into))
            for whole in await gathered:
                own.add(whole)
            with own:
                working = asyncio.to_thread(own_time.pydll_hold_counted, 2 * ms)
            worker = await working
            into["worker_ns"] += worker.ns
            with own:
                own.add(worker)
                ident = f"{span.get_span_context().span_id:016x}"
                into["own_ns"][ident], into["pieces"][ident] = own.ns, own.pieces
                into["cpu_ns"][ident] = own.cpu_ns

    async def child(i: int, n: int, name: str, ms: float, into: dict) -> own_time.Held:
        """Its own span's code is its truth; all of its code (its span's start and end
        included: they run in the request's context) goes into the request's."""
        own, whole = Own(), Own()
        with whole:
            span = tracer.start_span(f"child-{i}-{n}" if into is truth else f"{name}-child-{i}-{n}")
            activation = trace.use_span(span, end_on_exit=True)
            activation.__enter__()
            with own:
                own_time.spin(ms)
        await asyncio.sleep(0.001)
        with whole:
            with own:
                into["child_ns"][f"{span.get_span_context().span_id:016x}"] = own.ns
            activation.__exit__(None, None, None)
        return own_time.Held(whole.ns, whole.cpu_ns)

    async def yielding(i: int) -> None:
        own = Own()
        with tracer.start_as_current_span(f"waiting-{i}") as span:
            waits0 = own_time.waits()
            for _ in range(10):
                with own:
                    own_time.spin(0.5)
                await asyncio.sleep(0)
            ident = f"{span.get_span_context().span_id:016x}"
            truth["pieces"][ident] = own.pieces
            truth["loop_waits_ns"][ident] = own_time.waits() - waits0

    def hog() -> None:
        hog_on.wait()
        while not stop.is_set():
            t0 = time.time_ns()  # holds the GIL from here (time.sleep has just taken it back) ...
            _gil_holding_libc.usleep(3000)
            hog_ns.append((t0, time.time_ns()))  # ... to here: each hold and the Python around it
            time.sleep(0.002)

    def victim() -> None:
        hog_on.wait()
        with tracer.start_as_current_span("victim"):
            while not stop.is_set():
                time.sleep(0.001)

    async def phases() -> None:
        await asyncio.gather(*(asyncio.to_thread(time.sleep, 0.01) for _ in range(args.in_flight)))  # the workers exist
        scratch: dict = {"own_ns": {}, "cpu_ns": {}, "child_ns": {}, "worker_ns": 0, "pieces": {}}
        cpu0 = time.thread_time_ns()
        await asyncio.gather(*(request(i, "calibrate", 0, scratch) for i in range(args.in_flight)))
        truth["framework_ns"] = (time.thread_time_ns() - cpu0) // args.in_flight
        hold0 = own_time.read()[1].hold_ns
        await asyncio.gather(*(request(i) for i in range(args.in_flight)))
        hold1 = own_time.read()[1].hold_ns
        truth["loop_hold_ns"] = hold1 - hold0
        hog_on.set()
        await asyncio.gather(*(yielding(i) for i in range(args.in_flight)))
        stop.set()

    threads = [threading.Thread(target=hog, name="gil-hog"), threading.Thread(target=victim, name="victim")]
    for t in threads:
        t.start()
    try:
        if args.loop == "uvloop":
            import uvloop

            from otel_gil import _fastspan

            uvloop.run(phases())
            truth["uvloop"] = uvloop.__version__
            truth["uvloop_hooked"] = _fastspan.module_switches().get("uvloop.loop", {}).get("hooked", False)
            truth["python"] = list(sys.version_info[:2])
        else:
            asyncio.run(phases())
    finally:
        stop.set()
        hog_on.set()
        for t in threads:
            t.join()
    truth["hog_ns"] = hog_ns
    return truth


def short_blocker(tracer, args) -> dict:
    """A thread named ``short-hog`` takes the GIL from the span ``waiter``'s thread, which spins
    in Python meanwhile, holds it ``args.burst_ms`` (PyDLL) and ends (the kernel lets it go)
    before ``waiter`` ends; with ``--reuse-tid``, a thread named ``later`` gets its tid before that.
    The waiter waits from the hand-off on, so its wait holds the whole hold: ``burst_ns``,
    measured inside it (_clocked_hold).
    Then, under opentelemetry-instrument (``--auto``), otel_gil is uninstrumented: who wraps
    Thread.start after that (the threading instrumentation's wrapper must stay)."""
    truth: dict = {}
    go = threading.Event()

    def hog() -> None:
        truth["tid"] = threading.get_native_id()
        go.wait()  # returns with the GIL taken from the spinning waiter
        truth["burst_ns"] = _clocked_hold(args.burst_ms * 1000)

    truth["wrappers"] = _start_wrappers()
    release = threading.Event()
    with tracer.start_as_current_span("waiter"):
        thread = threading.Thread(target=hog, name="short-hog")
        thread.start()
        go.set()
        while "burst_ns" not in truth:  # wants the GIL until the hog is done with it
            pass
        thread.join()
        _wait_gone([thread])
        if args.reuse_tid:  # the hog's tid to a thread that lives on past the span (own pid namespace)
            with open("/proc/sys/kernel/ns_last_pid", "w") as f:
                f.write(str(truth["tid"] - 1))
            later = threading.Thread(target=release.wait, name="later")
            later.start()
            truth["later_tid"] = later.native_id
    release.set()
    if args.auto:
        GilInstrumentor().uninstrument()
        truth["wrappers_after_uninstrument"] = _start_wrappers()
    return truth


def turned_on(tracer, args) -> dict:
    """A free-threaded build running without its GIL, serving HTTP (a real ThreadingHTTPServer,
    a thread per request): the handler of ``/import`` imports ``args.legacy``, an extension
    that does not declare Py_mod_gil, which turns the GIL on for good. A span of another thread
    is in flight across it; then the hog scenario's ground truth, and a request holding the
    GIL for ``args.burst_ms`` (PyDLL), measured by the backend that started at the import."""
    from http.client import HTTPConnection
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    truth: dict = {"gil_at_start": sys._is_gil_enabled(), "gauge": {"start": _gil_gauge()}}  # no point yet

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with tracer.start_as_current_span(f"GET {self.path}", kind=trace.SpanKind.SERVER):
                if self.path == "/import":
                    truth["import_started_ns"] = time.time_ns()
                    __import__(args.legacy)
                    truth["import_ended_ns"] = time.time_ns()
                else:  # /hold
                    t0 = time.monotonic_ns()
                    _gil_holding_libc.usleep(args.burst_ms * 1000)
                    truth["request_hold_ns"] = time.monotonic_ns() - t0
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args) -> None:  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, name="http-server", daemon=True).start()

    def get(path: str) -> None:
        client = HTTPConnection(*server.server_address, timeout=60)
        client.request("GET", path)
        assert client.getresponse().status == 204
        client.close()

    with tracer.start_as_current_span("before"):
        time.sleep(0.01)
    started, crossed = threading.Event(), threading.Event()

    def bystander() -> None:
        with tracer.start_as_current_span("in flight"):
            started.set()
            crossed.wait()

    other = threading.Thread(target=bystander, name="bystander")
    other.start()
    started.wait()
    get("/import")
    crossed.set()
    other.join()
    truth["gil_after_import"] = sys._is_gil_enabled()
    truth["gauge"]["after"] = _gil_gauge()
    truth["measuring"] = GilInstrumentor._backend.wait(20)  # started by otel-gil's thread, not the import
    get("/hold")
    server.shutdown()
    truth.update(hog_and_victim(tracer, args))
    return truth


def transient(tracer, args) -> dict:
    """Two imports of modules that declare Py_mod_gil (``args.legacy``: their names, comma-separated)
    whose inits let the GIL go and sleep, the second started while the first runs: CPython turns
    the GIL on for each init and off after it, so the first import ends while the second still
    has it on. Nothing turned it on for good: otel-gil must not start measuring."""
    first, second = args.legacy.split(",")
    truth: dict = {}

    def load(name: str) -> None:
        with tracer.start_as_current_span(f"import {name}"):
            __import__(name)
        truth[f"gil_after_{name}"] = sys._is_gil_enabled()

    threads = [threading.Thread(target=load, args=(first,))]
    threads[0].start()
    time.sleep(0.1)
    threads.append(threading.Thread(target=load, args=(second,)))
    threads[1].start()
    for t in threads:
        t.join()
    truth["gil_at_end"] = sys._is_gil_enabled()
    return truth


def _gil_gauge() -> list:
    """The gil.enabled gauge's points now: [value, attributes]."""
    data = _metric_reader.get_metrics_data()
    return [[p.value, dict(p.attributes)] for rm in (data.resource_metrics if data else ()) for sm in rm.scope_metrics
            for m in sm.metrics if m.name == "gil.enabled" for p in m.data.data_points]


def _start_wrappers() -> list[str]:
    """Whose wrappers Thread.start goes through, outermost first (their wrapper functions' names)."""
    names, current = [], threading.Thread.__dict__["start"]
    while hasattr(current, "__wrapped__"):
        names.append(getattr(getattr(current, "_self_wrapper", None), "__qualname__", "?"))
        current = current.__wrapped__
    return names


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario",
                        choices=["hog", "convoy", "requests", "switches", "syscalls", "churn", "service", "cfork",
                                 "tasks", "short", "turned_on", "transient"])
    parser.add_argument("socket")
    parser.add_argument("--bursts", type=int, default=10)
    parser.add_argument("--burst-ms", type=int, default=50)
    parser.add_argument("--gap-ms", type=int, default=5)
    parser.add_argument("--reads", type=int, default=100)
    parser.add_argument("--iterations", type=int, default=500)
    parser.add_argument("--hold-us", type=int, default=200)
    parser.add_argument("--threads", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=100, help="churn: threads alive at once")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--io-threads", type=int, default=4, help="requests: request threads")
    parser.add_argument("--requests", type=int, default=20, help="requests: per request thread")
    parser.add_argument("--spans", type=int, default=30, help="cfork: spans the child makes")
    parser.add_argument("--in-flight", type=int, default=20, help="tasks: requests at once")
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio", help="tasks: whose event loop")
    parser.add_argument("--reuse-tid", action="store_true",
                        help="short: the hog's tid to a later thread (root, in a pid namespace of its own)")
    parser.add_argument("--legacy", help="turned_on: the module to import (an extension without Py_mod_gil); "
                        "transient: two, comma-separated")
    parser.add_argument("--auto", action="store_true",
                        help="run under opentelemetry-instrument: instrument by hand, after it, what "
                             "$OTEL_PYTHON_DISABLED_INSTRUMENTATIONS left out (gil, threading)")
    args = parser.parse_args()

    if args.auto:
        provider = trace.get_tracer_provider()
        provider.add_span_processor(SimpleSpanProcessor(_exporter))
        left_out = os.environ.get("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", "").split(",")
        if "gil" in left_out:
            GilInstrumentor().instrument(socket_path=args.socket, register_timeout_s=20)
        if "threading" in left_out:
            from opentelemetry.instrumentation.threading import ThreadingInstrumentor

            ThreadingInstrumentor().instrument()
    else:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_exporter))
        GilInstrumentor().instrument(
            tracer_provider=provider, meter_provider=MeterProvider([_metric_reader]),
            socket_path=args.socket, register_timeout_s=20,
        )
    tracer = provider.get_tracer("scenarios")
    scenarios = {"hog": hog_and_victim, "convoy": convoy, "requests": requests, "switches": switches,
                 "syscalls": syscalls, "churn": churn, "service": service, "cfork": cfork, "tasks": tasks,
                 "short": short_blocker, "turned_on": turned_on,
                 "transient": transient}
    source = GilInstrumentor._backend  # (the short scenario may uninstrument)
    truth = scenarios[args.scenario](tracer, args)
    spans = finished_spans()
    ring = source.state.ring
    report = {
        "backend": source.kind,
        "machine": platform.machine(),
        # where otel_gil and its C parts were imported from (a checkout, a venv)
        "modules": {m: sys.modules[m].__file__ for m in sorted(sys.modules) if m.split(".")[0] == "otel_gil"
                    and getattr(sys.modules[m], "__file__", None)},
        "pid": os.getpid(),
        "pid_seen_by_collector": ring.header.pid if ring else None,
        "uid": os.getuid(),
        "truth": truth,
        "spans": spans,
    }
    json.dump(report, sys.stdout)


if __name__ == "__main__":
    main()

"""Figures follow the context, not the thread (otel_gil/context_switches.c): on a synthetic
ring, where the test itself plays the writer, each task's, greenlet's and worker's own GIL
time goes to its span; spans of a thread no hook can see into say so. The C hooks track
contexts; the Python hooks cannot and give ``gil.status=shared_thread`` on shared threads."""

from __future__ import annotations

import asyncio
import contextvars
import ctypes
import gc
import importlib
import json
import os
import subprocess
import sys
import threading
import time
import weakref

import pytest

from otel_gil import spans, threads
from otel_gil.semconv import END_PASSED, SHARED_THREAD, UNTRACKED
from synthetic import log_hold, make_ring, record_wait, slot_for
from test_spans import FakeRegistration, fast, hooked, my_slot  # noqa: F401 (fast: a fixture)

MS = 1_000_000


def required(name: str):
    """A module of the test extra (pyproject's ``test``, via ``examples``): missing, the test fails."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        pytest.fail(f"{name} is missing ({exc}): a required test extra, run 'make venv'")


def _hooked_ring(fast: bool):
    ring = make_ring()
    with hooked(FakeRegistration(ring), fast) as (tracer, _, exporter):
        yield tracer, ring, my_slot(ring), exporter


@pytest.fixture
def loop_thread(fast):
    """(tracer, ring, the calling thread's slot, exporter) with the hooks of ``fast``."""
    yield from _hooked_ring(fast)


@pytest.fixture
def c_hooks():
    """As ``loop_thread``, with the C hooks: the ones that follow contexts."""
    yield from _hooked_ring(True)


def hold(slot, ms: float) -> None:
    """The writer's part of ``ms`` of GIL hold by this code (as long in real time: spans whose
    figures pass their duration are dropped)."""
    slot.hold_ns += int(ms * MS)
    time.sleep(ms / 1000)


def named(exporter) -> dict:
    return {s.name: dict(s.attributes) for s in exporter.get_finished_spans()}


def test_tasks_on_one_loop_get_their_own_hold(loop_thread, fast):
    tracer, _, slot, exporter = loop_thread

    async def request(name: str, hold_ms: int) -> None:
        with tracer.start_as_current_span(name):
            for _ in range(3):
                hold(slot, hold_ms)  # this step's own code
                await asyncio.sleep(0)

    async def main() -> None:
        await asyncio.gather(request("a", 1), request("b", 2))

    asyncio.run(main())
    got = named(exporter)
    if not fast:  # the Python hooks cannot tell the tasks apart: no hold is anyone's for sure
        for attrs in got.values():
            assert attrs["gil.status"] == SHARED_THREAD and "gil.hold_ms" not in attrs, attrs
            assert attrs["gil.wait_ms"] == 0.0
        return
    assert (got["a"]["gil.hold_ms"], got["b"]["gil.hold_ms"]) == (3.0, 6.0), got
    # a ran from its first step to its last, b's three steps in between; b ends after a's last step
    assert (got["a"]["gil.others_hold_ms"], got["b"]["gil.others_hold_ms"]) == (6.0, 2.0), got
    assert all("gil.status" not in attrs for attrs in got.values()), got


def test_a_child_spans_code_is_its_parents_too(c_hooks):
    tracer, _, slot, exporter = c_hooks

    async def child(n: int) -> None:
        with tracer.start_as_current_span(f"child-{n}"):
            hold(slot, n + 1)
            await asyncio.sleep(0)
            hold(slot, n + 1)

    async def request() -> None:
        with tracer.start_as_current_span("parent"):
            hold(slot, 5)
            await asyncio.gather(child(0), child(1))
            hold(slot, 5)

    async def main() -> None:
        await asyncio.gather(request(), other())

    async def other() -> None:
        with tracer.start_as_current_span("other"):
            for _ in range(4):
                hold(slot, 7)
                await asyncio.sleep(0)

    asyncio.run(main())
    got = named(exporter)
    assert got["child-0"]["gil.hold_ms"] == 2.0 and got["child-1"]["gil.hold_ms"] == 4.0, got
    assert got["parent"]["gil.hold_ms"] == 16.0, got
    assert got["other"]["gil.hold_ms"] == 28.0, got


def test_a_worker_threads_code_counts_where_it_ran(c_hooks):
    """asyncio.to_thread runs the function in a copy of the request's context: its hold and
    waits on the worker are the request's, beside the loop's waits while it was in flight."""
    tracer, ring, slot, exporter = c_hooks

    def work() -> None:
        worker = slot_for(ring, threading.get_native_id())
        hold(worker, 4)
        time.sleep(0.003)
        now = time.monotonic_ns()
        record_wait(worker, now - 3 * MS, now, blocker=0)

    async def request() -> None:
        with tracer.start_as_current_span("request"):
            hold(slot, 1)
            slot.wait_ns += 2 * MS  # the loop waited meanwhile
            time.sleep(0.002)
            await asyncio.to_thread(work)
            hold(slot, 1)

    asyncio.run(request())
    attrs = named(exporter)["request"]
    assert attrs["gil.hold_ms"] == 6.0, attrs  # 2 on the loop, 4 on the worker
    assert attrs["gil.wait_ms"] == 5.0, attrs  # the loop's 2, the worker's 3
    assert attrs["gil.acquisitions"] == 1, attrs  # the worker's one, after its wait


def test_greenlets_get_their_own_hold(loop_thread, fast):
    greenlet = required("greenlet")
    tracer, _, slot, exporter = loop_thread
    hub = greenlet.getcurrent()

    def request(name: str, hold_ms: int) -> None:
        with tracer.start_as_current_span(name):
            for _ in range(3):
                hold(slot, hold_ms)
                hub.switch()

    a, b = greenlet.greenlet(lambda: request("a", 1)), greenlet.greenlet(lambda: request("b", 2))
    while not (a.dead and b.dead):
        for g in (a, b):
            if not g.dead:
                g.switch()
        hold(slot, 10)  # the hub's own work: nobody's
    got = named(exporter)
    if not fast:
        assert {attrs.get("gil.status") for attrs in got.values()} == {SHARED_THREAD}, got
        return
    assert (got["a"]["gil.hold_ms"], got["b"]["gil.hold_ms"]) == (3.0, 6.0), got
    assert got["a"]["gil.others_hold_ms"] == 6.0 + 30.0, got  # b's and the hub's, while a was open


def test_a_thread_no_other_context_ran_on_keeps_its_figures(loop_thread):
    """A thread per request: the thread's figures over the span, whatever its spans overlap."""
    tracer, _, slot, exporter = loop_thread
    first = tracer.start_span("first")
    hold(slot, 1)
    with tracer.start_as_current_span("second"):  # not first's child, overlapping it
        hold(slot, 2)
    hold(slot, 4)
    first.end()
    got = named(exporter)
    assert (got["first"]["gil.hold_ms"], got["second"]["gil.hold_ms"]) == (7.0, 2.0), got
    assert all("gil.others_hold_ms" not in attrs and "gil.status" not in attrs for attrs in got.values()), got


@pytest.mark.parametrize("late_name", [None, "GET /b"])
@pytest.mark.parametrize("current", [True, False], ids=["a span current on the loop", "the loop done"])
def test_a_wait_on_the_loop_names_the_request_whose_code_ran(c_hooks, late_name, current, monkeypatch):
    """Blame on a shared thread: the span that ran in the holder's hold, from the loop's switches,
    not whichever span is current on the loop when the waiter's span ends (nor none, the loop
    thread known to otel_gil.threads: one the C hooks could name); by the name it ended with
    (a server span gets its route late)."""
    tracer, ring, slot, exporter = c_hooks
    monkeypatch.setattr(threads, "_memory", threads._Memory(time.monotonic_ns()))
    loop_tid = threading.get_native_id()
    ran: dict[str, tuple[int, int]] = {}
    victim_started, victim_may_end = threading.Event(), threading.Event()

    def victim() -> None:
        s = slot_for(ring, threading.get_native_id())
        with tracer.start_as_current_span("victim"):
            victim_started.set()
            victim_may_end.wait()
            t0, t1 = ran["b"]
            record_wait(s, t0, t1, blocker=loop_tid)

    async def request(name: str) -> None:
        with tracer.start_as_current_span(name) as span:
            for _ in range(2):
                t0 = time.monotonic_ns()
                time.sleep(0.003)  # (the loop thread's own code, as far as the synthetic ring knows)
                ran.setdefault(name, (t0, time.monotonic_ns()))
                await asyncio.sleep(0)
            if name == "b" and late_name:
                span.update_name(late_name)

    thread = threading.Thread(target=victim)
    thread.start()
    victim_started.wait()

    async def main() -> None:
        await asyncio.gather(request("a"), request("b"))
        t0, t1 = ran["b"]
        log_hold(ring, loop_tid, t0 - MS, t1 + MS)
        if current:
            with tracer.start_as_current_span("current on the loop when the victim ends"):
                victim_may_end.set()
                thread.join()

    asyncio.run(main())
    victim_may_end.set()
    thread.join()
    (event,) = [s for s in exporter.get_finished_spans() if s.name == "victim"][0].events
    assert event.attributes["gil.blocker.thread.native_id"] == loop_tid
    assert event.attributes["gil.blocker.span.name"] == (late_name or "b"), dict(event.attributes)


def test_the_switch_log_lets_go_of_a_name_it_wrapped_past_and_names_what_ran_since(c_hooks):
    """The loop's switch log (1,024 entries, blame's) holds the names of the spans it logged
    until it wraps past them (released a block at a time), and names the span whose code ran in
    a stretch it still reaches."""
    from otel_gil import _fastspan

    tracer, _, _, exporter = c_hooks
    name = "".join(["early", " request"])  # (an object of its own)

    async def request(span_name: str, steps: int, step_s: float = 0) -> None:
        with tracer.start_as_current_span(span_name):
            for _ in range(steps):
                time.sleep(step_s)  # (its code, longer than the loop's own between steps)
                await asyncio.sleep(0)

    async def main() -> tuple[int, int, int, int]:
        await asyncio.gather(request(name, 3), request("other", 3))
        exporter.clear()
        logged = sys.getrefcount(name)  # (the span's, its figures', the log's)
        await asyncio.gather(request("late", 600), request("later", 600))  # ~2,400 switches
        t0 = time.monotonic_ns()
        await asyncio.gather(request("latest", 50, 0.0005), request("last", 50, 0.0005))
        return logged, sys.getrefcount(name), t0, time.monotonic_ns()

    logged, wrapped, t0, t1 = asyncio.run(main())
    assert wrapped < logged, "the log still holds the name of a span it wrapped past"
    assert _fastspan.held_by(threading.get_native_id(), t0, t1)[0] in ("latest", "last")


def test_an_end_time_before_the_last_charge_gets_no_figures(c_hooks):
    tracer, _, slot, exporter = c_hooks

    async def request() -> None:
        span = tracer.start_span("request")
        with spans.trace.use_span(span):
            hold(slot, 1)
            await asyncio.sleep(0.002)
        span.end(end_time=time.time_ns() - 1_000_000)

    async def main() -> None:
        await asyncio.gather(request(), asyncio.sleep(0))

    asyncio.run(main())
    assert named(exporter)["request"]["gil.status"] == END_PASSED


# Loops that enter their tasks' contexts in C (otel_gil/module_switches.c): how each runs a coroutine.
C_LOOPS = {"uvloop": lambda uvloop, main: uvloop.run(main),
           "rloop": lambda rloop, main: rloop.new_event_loop().run_until_complete(main)}


async def two_requests(tracer, slot) -> None:
    """Requests ``a`` and ``b`` on one loop, each holding 1 ms (in ``slot``, its thread's) in a step."""
    async def request(name: str) -> None:
        with tracer.start_as_current_span(name):
            hold(slot, 1)
            await asyncio.sleep(0)

    await asyncio.gather(request("a"), request("b"))


def holds(exporter) -> tuple:
    got = named(exporter)
    return got["a"].get("gil.hold_ms"), got["b"].get("gil.hold_ms")


def test_a_spans_contexts_are_let_go_of_as_it_ends(c_hooks):
    """The thread's cache of contexts (switch_hooks.h's seen and by_otel) forgets the contexts of a
    span as it ends (forget_running): OpenTelemetry's context that held the span is freed with its
    task, as without otel-gil, not some switches later (fails with forget_running's call taken out)."""
    from opentelemetry import context as otel_context

    tracer, kept = c_hooks[0], []

    async def request() -> None:
        with tracer.start_as_current_span("a"):
            kept.append(weakref.ref(otel_context.get_current()))
            await asyncio.sleep(0)

    asyncio.run(request())
    gc.collect()
    assert kept and kept[0]() is None


def test_ctx_run_bound_by_the_hooks_passes_every_argument_and_is_collected(c_hooks):
    """Context.run's replacement binds without a method object (switch_hooks.h's BoundRun): the
    context is its __self__; positional and keyword arguments reach the callable whether the
    caller lends a spare argument slot (a plain call) or not (``*args``: on the stack, or
    allocated past 8); a bound run kept in its own context's variable is collected with it.
    From 3.14 the context watcher sees the switches: Context.run stays the builtin's."""
    ctx = contextvars.copy_context()
    run = ctx.run
    if sys.version_info >= (3, 14):
        assert type(contextvars.Context.__dict__["run"]).__name__ == "method_descriptor", run
        return
    assert (type(contextvars.Context.__dict__["run"]).__name__, type(run).__name__) == ("ContextRun", "BoundRun")
    assert run.__self__ is ctx

    def echo(*args, **kwargs):
        return args, kwargs

    assert run(echo, 5, z=6) == ((5,), {"z": 6})
    assert run(echo, *[1, 2]) == ((1, 2), {})
    assert run(echo, *range(12), y=3) == (tuple(range(12)), {"y": 3})
    assert contextvars.Context.run(ctx, echo, 4) == ((4,), {})
    var = contextvars.ContextVar("bound")
    kept = contextvars.copy_context()
    kept.run(var.set, kept.run)  # kept -> its variable -> the bound run -> kept
    gone = weakref.ref(kept)
    del kept
    gc.collect()
    assert gone() is None


@pytest.mark.parametrize("name", C_LOOPS)
def test_tasks_on_a_loop_written_in_c_get_their_own_hold(loop_thread, fast, name):
    """uvloop and rloop enter their tasks' contexts in C: the C hooks see it through their GOT
    entries of PyContext_Enter/Exit (3.9-3.13) or the context watchers (3.14+); the Python
    hooks see no switch and say so."""
    module = required(name)
    tracer, _, slot, exporter = loop_thread
    C_LOOPS[name](module, two_requests(tracer, slot))
    got = named(exporter)
    if fast:
        assert holds(exporter) == (1.0, 1.0), got
    else:
        assert {attrs.get("gil.status") for attrs in got.values()} == {SHARED_THREAD}, got


@pytest.mark.skipif(sys.version_info >= (3, 14), reason="3.14's context watchers see them: no GOT entry is hooked")
@pytest.mark.parametrize("name, module", [("uvloop", "uvloop.loop"), ("rloop", "rloop._rloop")])
def test_got_entries_are_hooked_while_tracking_and_restored_after(name, module):
    """A loop's module loaded before instrument(): its GOT entries of PyContext_Enter and
    PyContext_Exit point to the hooks while contexts are tracked, and hold their own values
    again after."""
    required(name)
    from otel_gil import _fastspan

    def entries() -> dict[str, tuple[bool, int]]:
        state = _fastspan.module_switches()[module]
        return {e["symbol"]: (e["hooked"], ctypes.c_void_p.from_address(e["address"]).value)
                for e in state["entries"]}

    before = entries()  # empty until first hooked: no entry found yet
    with hooked(FakeRegistration(make_ring()), True):
        state = _fastspan.module_switches()[module]
        assert state["hooked"] and state["error"] == "" and f"/{name}/" in state["object"], state
        during = entries()
    after = entries()
    assert set(during) == {"PyContext_Enter", "PyContext_Exit"}, during
    assert all(hooked_ for hooked_, _ in during.values()), during
    assert not any(hooked_ for hooked_, _ in after.values()), after
    assert all(after[s][1] != during[s][1] for s in during), (during, after)
    assert not before or before == after, (before, after)
    assert not _fastspan.module_switches()[module]["hooked"]


@pytest.mark.skipif(sys.version_info >= (3, 14), reason="3.14's context watchers see uvloop: no GOT entry is hooked")
def test_uvloop_loaded_after_instrument_is_hooked_when_its_loop_is_first_seen():
    """uvloop imported after instrument() (as uvicorn does under opentelemetry-instrument) is
    hooked at the first span that sees its loop running, also on a thread whose contexts
    switched before (a Context.run of the app's own)."""
    uvloop = required("uvloop")
    from otel_gil import _fastspan

    module = sys.modules.pop("uvloop.loop")  # not loaded yet, as far as instrument() can tell
    ring = make_ring()
    try:
        with hooked(FakeRegistration(ring), True) as (tracer, _, exporter):
            sys.modules["uvloop.loop"] = module
            assert not _fastspan.module_switches()["uvloop.loop"]["hooked"]

            def loop_thread() -> None:
                slot = my_slot(ring)
                contextvars.copy_context().run(lambda: None)  # a switch seen before any span
                uvloop.run(two_requests(tracer, slot))

            thread = threading.Thread(target=loop_thread)
            thread.start()
            thread.join()
            assert _fastspan.module_switches()["uvloop.loop"]["hooked"]
    finally:
        sys.modules["uvloop.loop"] = module
    assert holds(exporter) == (1.0, 1.0), named(exporter)


@pytest.mark.skipif(sys.version_info >= (3, 14), reason="3.14's context watchers see uvloop: no GOT entry is hooked")
def test_uvloop_imported_after_instrument_is_hooked_as_its_import_ends():
    """uvloop imported after instrument() (uvicorn under opentelemetry-instrument) has its GOT
    hooked by the import (app start), before any span: no request pays for the patching."""
    required("uvloop")
    code = """if True:
        import sys
        from opentelemetry.sdk.trace import TracerProvider
        from otel_gil import GilInstrumentor, _fastspan
        GilInstrumentor().instrument(tracer_provider=TracerProvider(), backend="inprocess")
        assert "uvloop" not in sys.modules
        import uvloop
        print(_fastspan.module_switches()["uvloop.loop"]["hooked"])
        GilInstrumentor().uninstrument()
        print(_fastspan.module_switches()["uvloop.loop"]["hooked"])
    """
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False"], done.stdout + done.stderr


@pytest.mark.skipif(sys.version_info >= (3, 14), reason="3.14's context watchers see uvloop: no GOT entry is hooked")
def test_a_forked_child_keeps_uvloops_hooks_and_restores_its_own():
    """A child forked while uvloop's entries are hooked runs its tasks with their own figures,
    and its uninstrument restores its own entries (the parent's stay hooked)."""
    uvloop = required("uvloop")
    from otel_gil import _fastspan

    def hooked_now() -> list[bool]:
        return [e["hooked"] for e in _fastspan.module_switches()["uvloop.loop"]["entries"]]

    ring = make_ring()
    with hooked(FakeRegistration(ring), True) as (tracer, _, exporter):
        assert hooked_now() == [True, True]
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report, then leave without pytest's teardown
            try:
                uvloop.run(two_requests(tracer, my_slot(ring)))
                spans.unwrap_span()
                os.write(w, json.dumps({"holds": holds(exporter), "after": hooked_now()}).encode())
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r) as pipe:
            child = json.loads(pipe.read() or "{}")
        os.waitpid(pid, 0)
        assert hooked_now() == [True, True]  # the parent's
    assert child == {"holds": [1.0, 1.0], "after": [False, False]}, child


def test_a_span_that_lived_through_an_uninstrument_says_so():
    """Charges of its code were missed while otel-gil was off: a shared thread's span has no
    figure of its own then."""
    ring = make_ring()
    with hooked(FakeRegistration(ring), True) as (tracer, processor, exporter):
        slot = my_slot(ring)

        async def request(name: str, off: bool) -> None:
            with tracer.start_as_current_span(name):
                hold(slot, 1)
                await asyncio.sleep(0)
                if off:  # as uninstrument() and instrument() do
                    spans._fastspan.untrack_contexts()
                    spans._track_contexts(processor._hooks)
                hold(slot, 1)

        async def main() -> None:
            await asyncio.gather(request("through", True), request("other", False))

        asyncio.run(main())
    got = named(exporter)
    assert got["through"]["gil.status"] == UNTRACKED and "gil.hold_ms" not in got["through"], got


def test_a_loop_started_after_calm_spans_on_the_thread_is_still_probed(c_hooks):
    """The C hooks ask asyncio for the running loop only where the thread state's dict changed
    since it last said none ran: a loop whose switches no hook sees, set after calm spans on the
    same thread, still marks the spans there. From 3.14 the context watcher sees every switch:
    no loop is probed, and none marks a span."""
    tracer, ring, _, exporter = c_hooks
    unseen_loop = type("UnseenLoop", (), {})()  # no stdlib loop, nor a hooked C one

    def run() -> None:
        slot_for(ring, threading.get_native_id())  # this thread's slot
        for name in ("calm-1", "calm-2"):
            tracer.start_span(name).end()
        asyncio._set_running_loop(unseen_loop)
        try:
            tracer.start_span("on-the-loop").end()
        finally:
            asyncio._set_running_loop(None)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    got = named(exporter)
    assert [got[n].get("gil.status") for n in ("calm-1", "calm-2")] == [None, None], got
    assert got["on-the-loop"].get("gil.status") == (None if sys.version_info >= (3, 14) else SHARED_THREAD), got

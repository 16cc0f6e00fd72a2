"""Each wait drawn once per trace (otel_gil/wait_spans.py), on a synthetic ring where the test
plays the writer: under the span whose code it held up, else the nearest common ancestor of the
spans it held up, while every span in flight keeps the wait in its figures and events."""

from __future__ import annotations

import asyncio
import contextvars
import os
import threading
import time

import pytest
from opentelemetry import trace

from otel_gil import ring as ringlib
from otel_gil import wait_spans
from otel_gil.semconv import GIL_WAIT
from synthetic import make_ring, record_wait
from test_spans import FakeRegistration, fast, hooked, my_slot  # noqa: F401 (fast: a fixture)

MS = 1_000_000


@pytest.fixture
def loop_thread(fast):
    """(tracer, the calling thread's slot, exporter), wait spans from 1 ms on."""
    ring = make_ring()
    wait_spans.configure(1)
    try:
        with hooked(FakeRegistration(ring), fast) as (tracer, _, exporter):
            yield tracer, my_slot(ring), exporter
    finally:
        wait_spans.configure(0)


def a_wait(slot) -> tuple[int, int]:
    """3 ms of this thread waiting for the GIL (as the writer records it): its start and end."""
    t0 = time.monotonic_ns()
    time.sleep(0.003)
    t1 = time.monotonic_ns()
    record_wait(slot, t0, t1, blocker=1)
    return t0, t1


def finished(exporter) -> tuple[dict, list]:
    """The finished spans by name (one each), and the gil.wait spans."""
    spans = exporter.get_finished_spans()
    named = {s.name: s for s in spans if s.name != GIL_WAIT}
    assert len(named) == len(spans) - sum(s.name == GIL_WAIT for s in spans), [s.name for s in spans]
    return named, [s for s in spans if s.name == GIL_WAIT]


def waits_of(span) -> list[int]:
    return [e.timestamp for e in span.events if e.name == "gil.wait"]


def fanout(tracer, slot, waits: dict, requests: tuple[str, ...] = ("request",)) -> None:
    """Each request a span with three gather parts, each part a span of its own, on one loop:
    while they are all in flight, a wait in the loop's own code (a callback in no request's
    context: ``waits["loop"]``), then one in part 1's code of the first request (``waits["part"]``)."""
    in_flight: asyncio.Event  # made on the loop (before 3.10, an Event binds to the loop current when made)

    async def part(name: str, n: int) -> None:
        with tracer.start_as_current_span(f"{name} part {n}"):
            await in_flight.wait()
            if n == 1 and name == requests[0]:
                waits["part"] = a_wait(slot)
            await asyncio.sleep(0.005)

    async def request(name: str) -> None:
        with tracer.start_as_current_span(name):
            await asyncio.gather(*(part(name, n) for n in range(3)))

    def loop_code() -> None:
        waits["loop"] = a_wait(slot)
        in_flight.set()

    async def main() -> None:
        nonlocal in_flight
        in_flight = asyncio.Event()
        tasks = asyncio.gather(*(request(name) for name in requests))
        await asyncio.sleep(0.002)  # every part started
        asyncio.get_running_loop().call_soon(loop_code, context=contextvars.Context())
        await tasks

    asyncio.run(main())


def test_a_loop_wait_is_drawn_once_under_the_span_whose_code_it_held_up(loop_thread, fast):
    """A wait in the loop's own code held up the request and its three parts: one bar, under the
    request. One in part 1's code: under part 1 (the Python hooks cannot tell whose code ran, so
    under the request). Every span keeps both waits as events."""
    tracer, slot, exporter = loop_thread
    waits: dict = {}
    fanout(tracer, slot, waits)
    found, bars = finished(exporter)
    request = found["request"]
    assert len(bars) == 2, [(b.start_time, b.parent.span_id) for b in bars]
    by_length = {b.end_time - b.start_time: b for b in bars}
    loop_bar = by_length[waits["loop"][1] - waits["loop"][0]]
    part_bar = by_length[waits["part"][1] - waits["part"][0]]
    assert loop_bar.parent.span_id == request.context.span_id
    owner = found["request part 1"] if fast else request
    assert part_bar.parent.span_id == owner.context.span_id, (part_bar.parent, owner.name)
    for name in ("request", "request part 0", "request part 1", "request part 2"):  # (each span's clocks read apart)
        assert sorted(waits_of(found[name])) == pytest.approx(sorted(b.start_time for b in bars), abs=0.1 * MS), name


def test_each_trace_draws_a_loop_wait_once(loop_thread, fast):
    """Two requests in flight on one loop, each its own trace: each draws the loop's wait once,
    under its own request span; a wait in the first's part held up the second too (its loop could
    run none of its tasks): drawn under the second's request span, once."""
    tracer, slot, exporter = loop_thread
    waits: dict = {}
    fanout(tracer, slot, waits, ("a", "b"))
    found, bars = finished(exporter)
    assert len(bars) == 4, [(b.start_time, b.parent.span_id) for b in bars]
    requests = {found[name].context.trace_id: found[name] for name in ("a", "b")}
    for trace_id, request in requests.items():
        mine = [b for b in bars if b.context.trace_id == trace_id]
        assert sorted(b.end_time - b.start_time for b in mine) == sorted(e - s for s, e in waits.values())
        under = {b.parent.span_id for b in mine}
        if request.name == "b" or not fast:
            assert under == {request.context.span_id}, (request.name, under)
        else:
            assert under == {request.context.span_id, found["a part 1"].context.span_id}, under


def test_on_a_thread_of_its_own_the_innermost_span_draws(loop_thread):
    """A thread that runs one context: the wait held up the innermost span; its parent keeps
    the event and draws nothing."""
    tracer, slot, exporter = loop_thread
    with tracer.start_as_current_span("parent"):
        with tracer.start_as_current_span("child"):
            a_wait(slot)
    found, (bar,) = finished(exporter)
    assert bar.parent.span_id == found["child"].context.span_id
    assert waits_of(found["parent"]) == pytest.approx([bar.start_time], abs=0.1 * MS)
    assert waits_of(found["child"]) == [bar.start_time]


def test_a_wait_is_drawn_once_whichever_span_ends_first(loop_thread):
    """A parent ending before its child (neither current): one bar."""
    tracer, slot, exporter = loop_thread
    parent = tracer.start_span("parent")
    child = tracer.start_span("child", context=trace.set_span_in_context(parent))
    a_wait(slot)
    parent.end()
    child.end()
    found, bars = finished(exporter)
    assert len(bars) == 1 and bars[0].parent.span_id == parent.get_span_context().span_id, bars
    assert len(waits_of(found["parent"])) == len(waits_of(found["child"])) == 1


def test_a_parent_draws_what_was_handed_up_even_once_its_ring_lost_it(loop_thread):
    """Waits a part handed up to its request, then RING_LEN more in the request's own code: the
    request's slot no longer has the first ones, but each is drawn once."""
    tracer, slot, exporter = loop_thread
    first: list = []

    async def part() -> None:
        with tracer.start_as_current_span("part"):
            await asyncio.sleep(0)
            asyncio.get_running_loop().call_soon(lambda: first.append(a_wait(slot)), context=contextvars.Context())
            await asyncio.sleep(0.005)

    async def request() -> None:
        with tracer.start_as_current_span("request"):
            await asyncio.gather(part())
            for _ in range(ringlib.RING_LEN):
                a_wait(slot)

    asyncio.run(request())
    found, bars = finished(exporter)
    request_span = found["request"]
    assert len(waits_of(request_span)) == ringlib.RING_LEN
    assert request_span.attributes["gil.long_waits_dropped"] == 1
    assert len(bars) == ringlib.RING_LEN + 1 and len({b.start_time for b in bars}) == len(bars)
    assert all(b.parent.span_id == request_span.context.span_id for b in bars)


def test_what_is_remembered_of_drawn_waits_is_bounded(loop_thread, monkeypatch):
    """The last MAX_DRAWN waits drawn, whatever their traces; every trace still draws its own."""
    tracer, slot, exporter = loop_thread
    monkeypatch.setattr(wait_spans, "MAX_DRAWN", 3)
    for i in range(5):
        with tracer.start_as_current_span(f"request {i}"):
            a_wait(slot)
    assert len(wait_spans._drawn) == 3
    assert len(finished(exporter)[1]) == 5


def test_a_fork_while_another_thread_draws_leaves_the_child_free_to_draw():
    """The lock the hand-ups take is new in a child forked while another thread held it."""
    held, release = threading.Event(), threading.Event()

    def drawing() -> None:
        with wait_spans._lock:
            held.set()
            release.wait()

    thread = threading.Thread(target=drawing)
    thread.start()
    held.wait()
    try:
        pid = os.fork()
        if pid == 0:
            os._exit(0 if wait_spans._lock.acquire(timeout=2) else 1)
        _, status = os.waitpid(pid, 0)
    finally:
        release.set()
        thread.join()
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_span_open_for_an_hour_keeps_the_last_waits_handed_up(loop_thread, monkeypatch):
    """A streaming response's span, open while its 3,600 chunks (one a second for an hour) are
    sent, each chunk a span of its own in flight through a wait in the loop's code (handed up):
    it never keeps more than MAX_HANDED of them, draws the last ones, and counts the rest."""
    tracer, slot, exporter = loop_thread
    monkeypatch.setattr(wait_spans, "threshold_ns", 10_000)  # 20 µs waits, not 3 ms ones: the hour in a second
    chunks, kept = 3600, []

    def short_wait() -> tuple[int, int]:
        t0 = time.monotonic_ns()
        while time.monotonic_ns() - t0 < 20_000:
            pass
        t1 = time.monotonic_ns()
        record_wait(slot, t0, t1, blocker=1, long_wait_ns=10_000)
        return t0, t1

    async def chunk(waits: list) -> None:
        with tracer.start_as_current_span("chunk"):
            await asyncio.sleep(0)
            asyncio.get_running_loop().call_soon(lambda: waits.append(short_wait()), context=contextvars.Context())
            await asyncio.sleep(0)
            await asyncio.sleep(0)

    async def stream() -> list:
        waits: list = []
        with tracer.start_as_current_span("stream") as span:
            for _ in range(chunks):
                await asyncio.gather(chunk(waits))
                kept.append(len(getattr(span, wait_spans._HANDED, ())))
        return waits

    waits = asyncio.run(stream())
    assert len(waits) == chunks and max(kept) == wait_spans.MAX_HANDED
    found = exporter.get_finished_spans()
    (span,) = [s for s in found if s.name == "stream"]
    bars = [s for s in found if s.name == GIL_WAIT]
    assert span.attributes["gil.wait_spans_dropped"] == chunks - wait_spans.MAX_HANDED
    events = sorted(e.timestamp for e in span.events if e.name == "gil.wait")  # (each span's clocks read apart)
    assert sorted(b.start_time for b in bars) == pytest.approx(events, abs=0.1 * MS)
    last = {end - start for start, end in waits[-wait_spans.MAX_HANDED:]}
    assert {b.end_time - b.start_time for b in bars} == last
    assert all(b.parent.span_id == span.context.span_id for b in bars)

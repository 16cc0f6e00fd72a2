"""The C span hooks' long wait (otel_gil/long_waits.c) against the Python hooks': in one
process, one real long wait (a thread named "blocker" holds the GIL 4 ms through a
ctypes.PyDLL call), its blame computed by ``spans.figures`` from the span's own snapshot,
then the span ended by the C hooks, which must leave the same ``gil.wait`` event and
``gil.top_blocker.*`` attributes, and take most such spans themselves."""

from __future__ import annotations

import ctypes
import threading
import time

import pytest
from opentelemetry.sdk.trace import TracerProvider

from otel_gil import spans, threads, wait_spans
from otel_gil.inprocess import InProcess
from otel_gil.semconv import TOP_BLOCKER

if spans._fastspan is None:
    pytest.fail("otel_gil._fastspan is not built: pip install -e .")


@pytest.fixture(params=[0, 50], ids=["no wait spans", "wait spans from 50 ms"])
def setup(monkeypatch, request):
    monkeypatch.setattr(wait_spans, "threshold_ns", request.param * 1_000_000)
    registration = InProcess(long_wait_ns=1_000_000)
    registration.start()
    handed, python_end = [], spans.end_wrapper

    def end_wrapper(*args):
        handed.append(args[1])
        return python_end(*args)

    monkeypatch.setattr(spans, "end_wrapper", end_wrapper)
    provider = TracerProvider()
    hook = spans.GilSpanProcessor(registration, None, fast=True)
    spans.hook_provider(provider, hook)
    threads.watch_starts()
    usleep = ctypes.PyDLL(None).usleep
    go, entered = threading.Lock(), threading.Lock()
    go.acquire()
    entered.acquire()

    def hold():
        while go.acquire() and not stop:
            entered.release()
            usleep(4000)

    stop = False
    blocker = threading.Thread(target=hold, name="blocker", daemon=True)
    blocker.start()
    yield provider.get_tracer("t"), go, entered, handed, blocker
    stop = True
    go.release()
    blocker.join()
    spans.unwrap_span()
    threads.unwatch_starts()
    registration.stop()


def _plain(value):
    return tuple(value) if isinstance(value, list) else value


def _long_wait(tracer, go, entered, handed, named: str) -> bool:
    """One span with a long wait, ended by the C hooks, whose figures must be the Python hooks'
    (``spans.figures`` on the same wait), its blocker named ``named``: whether it had the wait
    and the C hooks took it."""
    span = tracer.start_span("op")
    go.release()
    entered.acquire()  # the blocker took the GIL: this thread waits 4 ms for it
    start = getattr(span, spans._SNAPSHOT_ATTR)
    attrs, events, _ = spans.figures(start, span.start_time)
    span.end()
    if not events:  # the OS ran this thread after the blocker's hold now and then: no wait
        return False
    expected = {k: v for k, v in attrs.items() if k.startswith(TOP_BLOCKER)}
    assert expected[f"{TOP_BLOCKER}.thread.name"] == named
    assert {k: v for k, v in span.attributes.items() if k.startswith(TOP_BLOCKER)} == expected
    assert list(span.attributes)[2:2 + len(expected)] == list(expected)  # after thread.*, before gil.wait_ms
    (name, event_attrs, timestamp, _), = events
    (event,) = span.events
    assert (event.name, event.timestamp) == (name, timestamp)
    assert dict(event.attributes) == {k: _plain(v) for k, v in event_attrs.items()}
    assert list(event.attributes) == list(event_attrs)
    if wait_spans.threshold_ns:  # a wait shorter than that drawn by none: hand-ups to this span closed
        assert getattr(span, wait_spans._HANDED) is wait_spans._CLOSED
    return span not in handed  # (a thread freed meanwhile: its owners settled by Python's first)


def test_a_long_wait_gets_the_python_hooks_figures_from_c(setup):
    tracer, go, entered, handed, _ = setup
    compared = sum(_long_wait(tracer, go, entered, handed, "blocker") for _ in range(20))
    assert compared >= 10, f"only {compared} of 20 spans had a long wait taken by the C hooks"


def test_the_blocker_is_named_anew_after_a_rename(setup):
    tracer, go, entered, handed, blocker = setup
    compared = 0
    for i in range(20):
        blocker.name = f"blocker {i}"
        compared += _long_wait(tracer, go, entered, handed, f"blocker {i}")
    assert compared >= 10, f"only {compared} of 20 spans had a long wait taken by the C hooks"


def test_a_new_owner_of_the_blockers_kernel_id_names_the_waits_after_it(setup):
    """The kernel gives an ended thread's id to a later thread: threads learns of the new owner
    (as at its start), and the C hooks, which keep what they read of the owners, name it."""
    tracer, go, entered, handed, blocker = setup
    compared = [0, 0]
    for i in range(40):
        if i == 20:
            now = time.monotonic_ns()
            threads._memory.add(threads._Owner(blocker.native_id, now, now, 12345, "reborn"))
        compared[i >= 20] += _long_wait(tracer, go, entered, handed, "blocker" if i < 20 else "reborn")
    assert min(compared) >= 10, f"{compared} of 20 spans before and after had a long wait taken by the C hooks"

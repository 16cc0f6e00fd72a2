"""otel_gil.parks' span figures from a synthetic ring (what the park hooks would have written):
deltas by kind, an open park closed at now, the top object type of the long parks, events for
parks of a switch interval or more (5 ms here), and nothing for a span ended on another thread
or whose slot went back (a fork)."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from otel_gil import parks, ring
from otel_gil.park_metrics import ParkedTotals
from synthetic import make_ring, slot_for

MS = 1_000_000


def park(slot: ring.Slot, start: int, end: int, kind: int, type_name: str = "") -> None:
    """What gil_on_unpark leaves (long parks from 1 ms)."""
    slot.parked_ns[kind] += end - start
    slot.parks += 1
    if end - start >= MS:
        lp = slot.park_ring[slot.long_parks % ring.PARK_RING_LEN]
        lp.start_ns, lp.end_ns, lp.kind, lp.type = start, end, kind, type_name.encode()
        slot.long_parks += 1


@pytest.fixture
def hooked():
    r = make_ring()
    slot = slot_for(r, threading.get_native_id())
    yield parks.Parks(r), slot


def test_a_span_gets_its_parks_by_kind_and_the_top_type(hooked):
    p, slot = hooked
    now = time.monotonic_ns()
    park(slot, now - 100 * MS, now - 90 * MS, ring.PARK_OBJECT, "list")  # before the span
    start = (p, parks.Parked(now - 85 * MS, tuple(slot.parked_ns), slot.parks, slot.long_parks),
             threading.get_native_id())
    park(slot, now - 80 * MS, now - 78 * MS, ring.PARK_OBJECT, "dict")
    park(slot, now - 70 * MS, now - 64 * MS, ring.PARK_OBJECT, "list")
    park(slot, now - 60 * MS, now - 59 * MS, ring.PARK_OBJECT, "dict")
    park(slot, now - 50 * MS, now - 50 * MS + 300_000, ring.PARK_APP_LOCK)
    slot.park_start_ns, slot.park_kind = now - 10 * MS, ring.PARK_STW  # open: counted up to the read
    attrs, events = parks.figures(start, 0)
    assert attrs["cpython.parked.critical_section_ms"] == pytest.approx(9)
    assert attrs["cpython.parked.app_lock_ms"] == pytest.approx(0.3)
    assert attrs["cpython.parked.stop_the_world_ms"] >= 10
    assert attrs["cpython.parks"] == 4
    assert (attrs["cpython.parked.critical_section.top_type"], attrs["cpython.parked.critical_section.top_type_ms"]) == \
        ("list", pytest.approx(6))
    assert [(e[0], e[1]["cpython.park.kind"], e[1]["cpython.park.object.type"], e[2], e[3]) for e in events] == \
        [("cpython.park", "critical_section", "list", now - 70 * MS, now - 64 * MS)]  # only parks >= 5 ms


def test_nothing_on_another_thread_or_a_slot_gone_back(hooked):
    p, slot = hooked
    park(slot, 1000, 2 * MS, ring.PARK_OTHER)
    before = parks.Parked(0, tuple(slot.parked_ns), slot.parks, slot.long_parks)
    assert parks.figures((p, before, threading.get_native_id() + 1), 0) == ({}, [])
    slot.parked_ns[ring.PARK_OTHER] = 0  # the slot started afresh
    assert parks.figures((p, before, threading.get_native_id()), 0) == ({}, [])


def test_a_span_on_a_loop_takes_its_long_parks_threshold_from_its_ring(hooked, monkeypatch):
    """Where parks follow contexts: a park is long from the ring's convoy_ns (5 ms), the one fact,
    even once the switch interval changed and parks were unhooked (stop() in between its end's
    charges and its figures)."""
    p, _ = hooked
    now = time.monotonic_ns()
    charges = object()
    own = ([0, 10 * MS, 0, 0, 0], 1, [(now - 20 * MS, now - 10 * MS, ring.PARK_OBJECT, b"list")], 0, 30 * MS,
           10 * MS, 0, 0)  # what _parkcontexts.end gives: one 10 ms park on a list, on its home thread
    fake = type("FakeParkContexts", (), {"start": staticmethod(lambda *args: charges),
                                         "end": staticmethod(lambda got: own if got is charges else None)})
    monkeypatch.setattr(parks, "_parkcontexts", fake)
    monkeypatch.setattr(parks, "current", p)
    monkeypatch.setattr(parks, "contexts", True)
    span = type("FakeSpan", (), {"parent": None, "context": type("Ctx", (), {"span_id": 1})()})()
    start = parks.snapshot(span)
    monkeypatch.setattr(parks, "current", None)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.1)
    try:
        attrs, events = parks.figures(start, 0)
    finally:
        sys.setswitchinterval(interval)
    assert attrs["cpython.parked.critical_section_ms"] == pytest.approx(10), attrs
    assert [e[1]["cpython.park.ms"] for e in events] == [pytest.approx(10)], events


def test_no_hooks_no_figures():
    assert parks.figures(None, 0) == ({}, [])


def test_the_counter_keeps_a_thread_names_parks_across_its_exit():
    """cpython.parked.time per thread name: a live thread's parks (an open one up to now), then
    the same after it exits (its slot freed, its parks in the header's exited totals)."""
    r = make_ring()
    me = threading.current_thread()
    slot = slot_for(r, threading.get_native_id())
    park(slot, 1000, 3 * MS, ring.PARK_OBJECT, "dict")
    slot.park_start_ns, slot.park_kind = 10 * MS, ring.PARK_STW
    totals = ParkedTotals()
    assert totals.update(r, 12 * MS)
    assert totals.by_name[me.name][ring.PARK_OBJECT] == 3 * MS - 1000
    assert totals.by_name[me.name][ring.PARK_STW] == 2 * MS
    slot.park_start_ns, slot.parked_ns[ring.PARK_STW] = 0, 4 * MS  # the park closed at 14 ms
    header = r.header
    header.exited_parked_ns[ring.PARK_OBJECT], header.exited_parked_ns[ring.PARK_STW] = 3 * MS - 1000, 4 * MS
    header.exits_started = header.exited_threads = 1
    slot.tid = 0  # exited: EXIT freed the slot, then folded its figures
    assert totals.update(r, 20 * MS, {threading.get_native_id(): me.name})
    assert totals.by_name[me.name][ring.PARK_OBJECT] == 3 * MS - 1000
    assert totals.by_name[me.name][ring.PARK_STW] == 4 * MS

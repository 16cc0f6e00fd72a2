"""Per-thread-name totals on a synthetic ring: monotonic through exits and tid reuse."""

import threading

from otel_gil import metrics, ring as ringlib
from synthetic import exit_steps, exit_thread, make_ring, slot_for


def test_exit_remainder_goes_to_the_thread_that_left():
    ring, totals = make_ring(), metrics.Totals()
    s = slot_for(ring, 4242)
    s.wait_ns, s.acquisitions = 1000, 1
    totals.update(ring, 0)
    s.wait_ns, s.acquisitions = 1500, 2  # after the read, before the exit
    exit_thread(ring, s)
    totals.update(ring, 0)
    assert totals.by_name == {"4242": [1500, 0, 2, 0]}


def test_reused_tid_is_a_new_thread_and_nothing_is_counted_twice():
    ring, totals = make_ring(), metrics.Totals()
    s = slot_for(ring, 77)
    s.hold_ns = 5000
    totals.update(ring, 0)
    exit_thread(ring, s)
    s = slot_for(ring, 77)  # same tid, a new thread
    s.hold_ns = 100
    totals.update(ring, 0)
    assert sum(v[1] for v in totals.by_name.values()) == 5100


def test_threads_never_seen_still_count():
    ring, totals = make_ring(), metrics.Totals()
    totals.update(ring, 0)
    s = slot_for(ring, 9)
    s.wait_ns = 300
    exit_thread(ring, s)
    s = slot_for(ring, 10)
    s.wait_ns = 200
    exit_thread(ring, s)
    totals.update(ring, 0)
    assert totals.by_name == {metrics.EXITED_THREADS: [500, 0, 0, 0]}


def test_a_read_in_the_middle_of_an_exit_counts_nothing_twice():
    """A collection at every step of an exit (figures added, count not yet, ...): the
    total never exceeds the truth, never goes down, and ends exactly at it."""
    ring, totals = make_ring(), metrics.Totals()
    stay = slot_for(ring, 5)
    stay.wait_ns = 2_000_000
    leave = slot_for(ring, 6)
    leave.wait_ns, leave.acquisitions = 1_000_000, 3
    totals.update(ring, 0)
    leave.wait_ns, leave.acquisitions = 1_500_000, 4  # after the read, before the exit
    seen = []
    for _ in exit_steps(ring, leave):
        totals.update(ring, 0)
        seen.append(sum(v[0] for v in totals.by_name.values()))
    assert all(total <= 3_500_000 for total in seen), seen
    assert seen == sorted(seen), seen
    assert seen[-1] == 3_500_000
    assert sum(v[2] for v in totals.by_name.values()) == 4
    assert totals.by_name["6"] == [1_500_000, 0, 4, 0]  # the exit went to the thread that left


def test_a_slot_stuck_mid_write_skips_the_read_instead_of_spinning():
    ring, totals = make_ring(), metrics.Totals()
    s = slot_for(ring, 5)
    s.wait_ns = 1000
    assert totals.update(ring, 0)
    s.seq, s.wait_ns = 1, 2000  # odd for ever: a writer that never finished
    done = []
    reader = threading.Thread(target=lambda: done.append(totals.update(ring, 0)), daemon=True)
    reader.start()
    reader.join(5)
    assert done == [False], "the reader spun on a slot that stays mid-write"
    assert totals.by_name == {"5": [1000, 0, 0, 0]}  # figures kept, not torn
    s.seq = 2
    assert totals.update(ring, 0) and totals.by_name == {"5": [2000, 0, 0, 0]}

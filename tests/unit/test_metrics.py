"""Per-thread-name totals on a synthetic ring: monotonic through exits and tid reuse."""

from otel_gil import metrics
from synthetic import make_ring, slot_for


def exit_thread(ring, slot):
    """What the BPF side does when a thread exits: free the slot, then fold its figures."""
    h = ring.header
    wait, hold, acq, convoy = slot.wait_ns, slot.hold_ns, slot.acquisitions, slot.convoy_waits
    slot.tid = 0
    h.exited_wait_ns += wait
    h.exited_hold_ns += hold
    h.exited_acquisitions += acq
    h.exited_convoy_waits += convoy
    h.exited_threads += 1


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

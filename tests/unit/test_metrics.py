"""Per-thread-name totals on a synthetic ring: monotonic through exits and tid reuse."""

import threading
from dataclasses import dataclass
from unittest import mock

import pytest

from otel_gil import metrics
from synthetic import exit_steps, exit_thread, make_ring, slot_for


@dataclass
class FakeThread:
    """What metrics read of a live ``threading.Thread``."""

    name: str


def test_exit_remainder_goes_to_the_thread_that_left():
    ring, totals = make_ring(), metrics.Totals()
    s = slot_for(ring, 4242)
    s.wait_ns, s.acquisitions = 1000, 1
    totals.update(ring, 0, started={4242: "flusher"})
    s.wait_ns, s.acquisitions = 1500, 2  # after the read, before the exit
    exit_thread(ring, s)
    totals.update(ring, 0)
    assert totals.by_name == {"flusher": [1500, 0, 2, 0]}


def test_a_thread_threading_does_not_know_yet_is_named_at_the_next_read():
    """A new thread takes the GIL before threading has its id: its first read waits for the name."""
    ring, totals = make_ring(), metrics.Totals()
    s = slot_for(ring, 4243)
    s.hold_ns = 100
    totals.update(ring, 0)
    assert totals.by_name == {}
    s.hold_ns = 300
    totals.update(ring, 0, started={4243: "Thread-12 (process_request_thread)"})
    assert totals.by_name == {"Thread-N (process_request_thread)": [0, 300, 0, 0]}
    s = slot_for(ring, 4244)  # never named (not a threading thread): its id, one read later
    s.hold_ns = 5
    totals.update(ring, 0)
    totals.update(ring, 0)
    assert totals.by_name["4244"] == [0, 5, 0, 0]


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


def test_a_thread_started_and_gone_between_two_reads_keeps_its_name():
    ring, totals = make_ring(), metrics.Totals()
    totals.update(ring, 0)
    s = slot_for(ring, 31)
    s.wait_ns, s.acquisitions = 700, 3
    exit_thread(ring, s)
    totals.update(ring, 0, started={31: "flusher"})
    assert totals.by_name == {"flusher": [700, 0, 3, 0]}


def test_exits_of_one_normalized_name_go_to_it_and_mixed_ones_to_exited_threads():
    ring, totals = make_ring(), metrics.Totals()
    totals.update(ring, 0)
    for tid, wait in ((40, 100), (41, 200)):
        s = slot_for(ring, tid)
        s.wait_ns = wait
        exit_thread(ring, s)
    totals.update(ring, 0, started={40: "Thread-7 (process_request_thread)", 41: "Thread-8 (process_request_thread)"})
    for tid, wait in ((42, 5), (43, 6)):
        s = slot_for(ring, tid)
        s.wait_ns = wait
        exit_thread(ring, s)
    totals.update(ring, 0, started={42: "Thread-9 (process_request_thread)", 43: "flusher"})
    assert totals.by_name == {"Thread-N (process_request_thread)": [300, 0, 0, 0], metrics.EXITED_THREADS: [11, 0, 0, 0]}


@pytest.mark.parametrize("name, label", [
    ("Thread-104 (process_request_thread)", "Thread-N (process_request_thread)"),
    ("Thread-3", "Thread-N"),
    ("Dummy-12", "Dummy-N"),
    ("ThreadPoolExecutor-0_17", "ThreadPoolExecutor-N_N"),
    ("worker-3", "worker-3"),  # a name the app chose stays as it is
    ("Thread-1x", "Thread-1x"),
])
def test_numbered_default_names_are_normalized(name, label):
    assert metrics.normalize(name) == label


def test_names_past_the_limit_go_to_other_threads():
    ring, totals = make_ring(nslots=2 * metrics.MAX_THREAD_NAMES), metrics.Totals()
    started = {}
    for tid in range(1, metrics.MAX_THREAD_NAMES + 11):
        slot_for(ring, tid, index=tid).hold_ns = 10
        started[tid] = f"worker-{tid}"
    with mock.patch.object(metrics.threads, "live", return_value={t: FakeThread(n) for t, n in started.items()}):
        totals.update(ring, 0)
    assert len(totals.by_name) == metrics.MAX_THREAD_NAMES + 1
    assert totals.by_name[metrics.OTHER_THREADS] == [0, 100, 0, 0]
    assert sum(v[1] for v in totals.by_name.values()) == 10 * (metrics.MAX_THREAD_NAMES + 10)


def test_a_read_in_the_middle_of_an_exit_counts_nothing_twice():
    """A collection at every step of an exit (figures added, count not yet, ...): the
    total never exceeds the truth, never goes down, and ends exactly at it."""
    ring, totals = make_ring(), metrics.Totals()
    stay = slot_for(ring, 5)
    stay.wait_ns = 2_000_000
    leave = slot_for(ring, 6)
    leave.wait_ns, leave.acquisitions = 1_000_000, 3
    totals.update(ring, 0, started={5: "stay", 6: "leave"})
    leave.wait_ns, leave.acquisitions = 1_500_000, 4  # after the read, before the exit
    seen = []
    for _ in exit_steps(ring, leave):
        totals.update(ring, 0)
        seen.append(sum(v[0] for v in totals.by_name.values()))
    assert all(total <= 3_500_000 for total in seen), seen
    assert seen == sorted(seen), seen
    assert seen[-1] == 3_500_000
    assert sum(v[2] for v in totals.by_name.values()) == 4
    assert totals.by_name["leave"] == [1_500_000, 0, 4, 0]  # the exit went to the thread that left


def test_a_slot_stuck_mid_write_skips_the_read_instead_of_spinning():
    ring, totals = make_ring(), metrics.Totals()
    s = slot_for(ring, 5)
    s.wait_ns = 1000
    assert totals.update(ring, 0, started={5: "w"})
    s.seq, s.wait_ns = 1, 2000  # odd for ever: a writer that never finished
    done = []
    reader = threading.Thread(target=lambda: done.append(totals.update(ring, 0)), daemon=True)
    reader.start()
    reader.join(5)
    assert done == [False], "the reader spun on a slot that stays mid-write"
    assert totals.by_name == {"w": [1000, 0, 0, 0]}  # figures kept, not torn
    s.seq = 2
    assert totals.update(ring, 0) and totals.by_name == {"w": [2000, 0, 0, 0]}

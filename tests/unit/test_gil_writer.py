"""gil_writer.h's state machine (what both writers do on each GIL event) driven with synthetic
events, no root and no interpreter: a test-only harness compiled with the system cc runs the
header on one header entry and a few slots, and prints the acting thread's slot and the
process-wide fields after each event. Each case's figures are worked out from the rules at
the top of gil_writer.h (times in ns; long waits and holds from 1 ms, convoys from 5 ms).
"""

from __future__ import annotations

import pytest
from c_harness import harness

MS = 1_000_000
# Reads "tid event now" lines (event: R release, A acquire, W wait, X exit), writes the acting
# thread's slot and the header's process-wide fields after each as "key=value ..." lines.
HARNESS = r"""
#include <linux/types.h>
#include <stdio.h>
#include <string.h>
#define GIL_INLINE static inline
#define GIL_SEQ_BUMP(s) ((s)->seq++)
#define GIL_PUBLISH(p, v) (*(p) = (v))
#define GIL_LOG2(x) (63 - __builtin_clzll(x))
#define GIL_ATOMIC_ADD(p, v) (*(p) += (v))
#define GIL_FREE_SLOT(s) ((s)->tid = 0, (s)->flags = 0)
#define GIL_READ(dst, n, src) ((void)(src), memset((dst), 0, (n)), 1) /* no interpreter to read: header.py stays 0 */
#define GIL_WHERE int
#define GIL_LINE(py, code, addr, depth, where) (-1)
#include "gil_location.h"
static struct gil_hold_page pages[GIL_HOLD_PAGES];
static unsigned long located;
#define GIL_HOLD_PAGE(slots, i) (&pages[i])
#define GIL_LOCATE(slots, h, n, tstate, where) (located++)
#include "gil_writer.h"

#define THREADS 8
static struct gil_header h;
static struct gil_slot slots[THREADS];

static struct gil_slot *slot_of(unsigned tid)
{
    struct gil_slot *s = &slots[tid % THREADS];
    if (s->tid != tid) {
        s->tid = tid;
        gil_slot_reset(s);
    }
    return s;
}

int main(void)
{
    h.long_wait_ns = h.long_hold_ns = 1000000;
    h.convoy_ns = 5000000;
    h.hold_record_ns = GIL_HOLD_RECORD_NS;
    unsigned tid;
    char event;
    unsigned long long now;
    while (scanf("%u %c %llu", &tid, &event, &now) == 3) {
        struct gil_slot *s = slot_of(tid);
        switch (event) {
        case 'R': gil_on_release(slots, &h, s, tid, now, 0); break;
        case 'A': gil_on_acquire(&h, s, tid, now); break;
        case 'W': gil_on_wait(&h, s, now); break;
        case 'X': gil_on_exit(&h, s); break;
        default: return 2;
        }
        const struct gil_long_wait *lw = &s->ring[(s->long_waits - 1) & (GIL_RING_LEN - 1)];
        printf("seq=%llu tid=%u flags=%u wait_ns=%llu hold_ns=%llu acquisitions=%llu convoy_waits=%llu long_waits=%llu "
               "long_holds=%llu wait_start_ns=%llu acquired_ns=%llu forced_waits=%llu "
               "lw_start=%llu lw_end=%llu lw_blocker=%u lw_held=%lld lw_forced=%u "
               "drop_request=%llu acquisitions_total=%llu held_total_ns=%llu holds_written=%llu located=%lu "
               "holder_tid=%u last_release_tid=%u exits_started=%llu exited_threads=%llu exited_wait_ns=%llu "
               "exited_hold_ns=%llu exited_acquisitions=%llu exited_convoy_waits=%llu\n",
               (unsigned long long)s->seq, s->tid, s->flags, (unsigned long long)s->wait_ns,
               (unsigned long long)s->hold_ns, (unsigned long long)s->acquisitions,
               (unsigned long long)s->convoy_waits, (unsigned long long)s->long_waits,
               (unsigned long long)s->long_holds, (unsigned long long)s->wait_start_ns,
               (unsigned long long)s->acquired_ns, (unsigned long long)s->forced_waits,
               (unsigned long long)(s->long_waits ? lw->start_ns : 0), (unsigned long long)(s->long_waits ? lw->end_ns : 0),
               s->long_waits ? lw->blocker_tid : 0, (long long)(s->long_waits ? lw->held_ns : 0),
               s->long_waits ? lw->flags : 0, (unsigned long long)h.drop_request,
               (unsigned long long)h.acquisitions_total, (unsigned long long)h.held_total_ns,
               (unsigned long long)h.holds_written, located, h.holder_tid, h.last_release_tid,
               (unsigned long long)h.exits_started, (unsigned long long)h.exited_threads,
               (unsigned long long)h.exited_wait_ns, (unsigned long long)h.exited_hold_ns,
               (unsigned long long)h.exited_acquisitions, (unsigned long long)h.exited_convoy_waits);
        fflush(stdout);
    }
    return 0;
}
"""
FORCED, UNCHECKED = 2, 4  # GIL_SLOT_FORCED, GIL_SLOT_UNCHECKED


@pytest.fixture(scope="module")
def writer(tmp_path_factory):
    """Run events through gil_writer.h: a list of the states after each."""
    run_harness = harness(tmp_path_factory.mktemp("writer"), HARNESS)

    def run(events: list) -> list[dict]:
        out = run_harness("".join(f"{t} {e} {n}\n" for t, e, n in events))
        states = [{k: int(v) for k, v in (kv.split("=") for kv in line.split())} for line in out.splitlines()]
        assert len(states) == len(events)
        assert all(state["seq"] % 2 == 0 for state in states)  # every event's writes between two bumps
        return states

    return run


def subset(state: dict, **expected) -> dict:
    return {k: state[k] for k in expected}


def test_a_forced_switch_counts_the_holders_wait_from_its_release(writer):
    """1 holds; 2 waits, times out once with 1 still holding (a drop request); 1 releases
    (FORCED: its wait opens, unchecked) and comes straight back; 2 takes the GIL, then 1:
    the wait of 1 stands, counted from its release."""
    states = writer([(1, "A", 1000), (2, "W", 2000), (2, "W", 5 * MS + 2000), (1, "R", 5 * MS + 3000),
                     (2, "A", 5 * MS + 4000), (1, "W", 5 * MS + 5000), (2, "R", 6 * MS + 5000), (1, "A", 6 * MS + 6000)])
    acquired, wait, timed_out, released, taken, back, handed, retaken = states
    assert subset(acquired, acquisitions=1, acquired_ns=1000, holder_tid=1, acquisitions_total=1) == \
        dict(acquisitions=1, acquired_ns=1000, holder_tid=1, acquisitions_total=1)
    assert (wait["wait_start_ns"], wait["drop_request"]) == (2000, 0)  # a first WAIT asks nothing
    assert timed_out["drop_request"] == 1  # a second with the holder unchanged: SET_GIL_DROP_REQUEST
    assert subset(released, hold_ns=5 * MS + 2000, long_holds=1, held_total_ns=5 * MS + 2000, holds_written=1,
                  located=1, wait_start_ns=5 * MS + 3000, flags=FORCED | UNCHECKED, holder_tid=0, last_release_tid=1) == \
        dict(hold_ns=5 * MS + 2000, long_holds=1, held_total_ns=5 * MS + 2000, holds_written=1, located=1,
             wait_start_ns=5 * MS + 3000, flags=FORCED | UNCHECKED, holder_tid=0, last_release_tid=1)
    # 2's wait: 5 ms + 2 us, a convoy and a long wait, blocked by 1, which held it for all of it
    # but the 1 us before 2's first WAIT (held_total at the release minus its mark, 1000 ns).
    assert subset(taken, wait_ns=5 * MS + 2000, convoy_waits=1, long_waits=1, lw_start=2000, lw_end=5 * MS + 4000,
                  lw_blocker=1, lw_held=5 * MS + 1000, lw_forced=0, forced_waits=0, drop_request=0,
                  acquisitions_total=2) == \
        dict(wait_ns=5 * MS + 2000, convoy_waits=1, long_waits=1, lw_start=2000, lw_end=5 * MS + 4000, lw_blocker=1,
             lw_held=5 * MS + 1000, lw_forced=0, forced_waits=0, drop_request=0, acquisitions_total=2)
    # STALE_CHECK at 1's WAIT: only the thread it let in took the GIL since: the wait stands, checked.
    assert (back["wait_start_ns"], back["flags"], back["drop_request"]) == (5 * MS + 3000, FORCED, 0)
    assert (handed["hold_ns"], handed["long_holds"], handed["flags"]) == (MS + 1000, 1, 0)  # no request: not forced
    assert subset(retaken, wait_ns=MS + 3000, forced_waits=1, convoy_waits=0, long_waits=1, lw_start=5 * MS + 3000,
                  lw_forced=1, lw_blocker=2, lw_held=MS + 1000, acquisitions=2, flags=0) == \
        dict(wait_ns=MS + 3000, forced_waits=1, convoy_waits=0, long_waits=1, lw_start=5 * MS + 3000, lw_forced=1,
             lw_blocker=2, lw_held=MS + 1000, acquisitions=2, flags=0)


def test_a_release_that_was_voluntary_is_no_wait(writer):
    """1 releases while a drop request is pending, but for I/O (Py_BEGIN_ALLOW_THREADS): 2
    and then 3 take the GIL before 1 asks for it again. STALE_CHECK drops the wait opened
    at the release; 1's next WAIT opens its real one."""
    states = writer([(1, "A", 1000), (2, "W", 2000), (2, "W", 5 * MS + 2000), (1, "R", 5 * MS + 3000),
                     (2, "A", 5 * MS + 4000), (2, "R", 6 * MS), (3, "A", 6 * MS + 1000), (1, "W", 9 * MS),
                     (3, "R", 9 * MS + 500_000), (1, "A", 9 * MS + 600_000)])
    released, asked, retaken = states[3], states[7], states[9]
    assert (released["flags"], released["wait_start_ns"]) == (FORCED | UNCHECKED, 5 * MS + 3000)
    assert (asked["wait_start_ns"], asked["flags"], asked["wait_ns"]) == (9 * MS, 0, 0)
    assert subset(retaken, wait_ns=600_000, forced_waits=0, convoy_waits=0, long_waits=0, acquisitions=2) == \
        dict(wait_ns=600_000, forced_waits=0, convoy_waits=0, long_waits=0, acquisitions=2)


def test_the_stale_check_also_runs_at_an_acquisition(writer):
    """A forced wait's first event after the release is the ACQUIRE itself (no timed-out WAIT
    between): it stands if only the thread it let in took the GIL in between."""
    states = writer([(1, "A", 1000), (2, "W", 2000), (2, "W", 5 * MS + 2000), (1, "R", 5 * MS + 3000),
                     (2, "A", 5 * MS + 4000), (2, "R", 5 * MS + 5000), (1, "A", 5 * MS + 9000)])
    assert subset(states[-1], wait_ns=6000, forced_waits=1, flags=0, acquisitions=2) == \
        dict(wait_ns=6000, forced_waits=1, flags=0, acquisitions=2)


def test_a_drop_request_needs_a_timeout_with_the_holder_unchanged(writer):
    """A second WAIT after another thread took the GIL is a new holder's interval: no request;
    a third, with that holder still on, asks. The next ACQUIRE clears it."""
    states = writer([(1, "A", 1000), (2, "W", 2000), (1, "R", 3000), (3, "A", 3500), (2, "W", 5 * MS + 3500),
                     (2, "W", 10 * MS + 3500), (3, "R", 10 * MS + 4000), (2, "A", 10 * MS + 5000)])
    assert [s["drop_request"] for s in states] == [0, 0, 0, 0, 0, 1, 1, 0]
    forced, taken = states[6], states[7]
    assert (forced["flags"], forced["wait_start_ns"]) == (FORCED | UNCHECKED, 10 * MS + 4000)  # 3 was asked
    assert subset(taken, wait_ns=10 * MS + 3000, convoy_waits=1, long_waits=1, lw_blocker=3, forced_waits=0) == \
        dict(wait_ns=10 * MS + 3000, convoy_waits=1, long_waits=1, lw_blocker=3, forced_waits=0)


def test_short_holds_are_neither_logged_nor_long_and_blame_is_clamped(writer):
    """A hold under hold_record_ns only adds to held_total_ns; a wait that began after every
    hold so far (its mark) blames none of them."""
    states = writer([(1, "A", 1000), (1, "R", 51_000), (2, "W", 60_000), (2, "A", 2 * MS + 60_000)])
    released, taken = states[1], states[3]
    assert subset(released, hold_ns=50_000, long_holds=0, holds_written=0, located=0, held_total_ns=50_000) == \
        dict(hold_ns=50_000, long_holds=0, holds_written=0, located=0, held_total_ns=50_000)
    assert subset(taken, wait_ns=2 * MS, long_waits=1, lw_held=0, lw_blocker=1, convoy_waits=0) == \
        dict(wait_ns=2 * MS, long_waits=1, lw_held=0, lw_blocker=1, convoy_waits=0)


def test_an_exit_frees_the_slot_then_folds_its_figures(writer):
    states = writer([(1, "A", 1000), (2, "W", 2000), (1, "R", 3 * MS), (2, "A", 3 * MS + 1000), (2, "R", 4 * MS),
                     (2, "X", 0), (1, "X", 0)])
    two, one = states[5], states[6]
    assert (two["tid"], two["flags"], two["exits_started"], two["exited_threads"]) == (0, 0, 1, 1)
    assert subset(one, exited_threads=2, exits_started=2, exited_wait_ns=3 * MS - 1000, exited_hold_ns=4 * MS - 2000,
                  exited_acquisitions=2, exited_convoy_waits=0) == \
        dict(exited_threads=2, exits_started=2, exited_wait_ns=3 * MS - 1000, exited_hold_ns=4 * MS - 2000,
             exited_acquisitions=2, exited_convoy_waits=0)


def test_the_thresholds_are_inclusive(writer):
    """A wait of exactly convoy_ns is a convoy and a long wait; a hold of exactly long_hold_ns is
    long, one of exactly hold_record_ns is logged."""
    states = writer([(1, "A", 1000), (2, "W", 1000), (1, "R", 101_000), (2, "A", 5 * MS + 1000),
                     (2, "R", 6 * MS + 1000)])
    released, taken, held = states[2], states[3], states[4]
    assert (released["holds_written"], released["long_holds"]) == (1, 0)
    assert (taken["wait_ns"], taken["convoy_waits"], taken["long_waits"]) == (5 * MS, 1, 1)
    assert (held["hold_ns"], held["long_holds"], held["holds_written"]) == (MS, 1, 2)

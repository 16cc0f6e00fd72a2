"""gil_writer.h's PARK and UNPARK (a free-threaded build's parks, by kind) and EXIT's fold of
parked time, driven with synthetic events through a test-only harness (no interpreter); long
parks from 1 ms (header.long_wait_ns)."""

from __future__ import annotations

import pytest
from c_harness import harness

from otel_gil import ring

MS = 1_000_000
# Reads "tid event now kind" lines (P park, U unpark, X exit), writes the acting slot after each.
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
#define GIL_READ(dst, n, src) ((void)(src), memset((dst), 0, (n)), 1)
#define GIL_WHERE int
#define GIL_LINE(py, code, addr, depth, where) (-1)
#include "gil_location.h"
#define GIL_HOLD_PAGE(slots, i) ((struct gil_hold_page *)0)
#define GIL_LOCATE(slots, h, n, tstate, where) ((void)0)
#include "gil_writer.h"

static struct gil_header h;
static struct gil_slot slots[4];

int main(void)
{
    h.long_wait_ns = 1000000;
    unsigned tid, kind;
    char event;
    unsigned long long now;
    while (scanf("%u %c %llu %u", &tid, &event, &now, &kind) == 4) {
        struct gil_slot *s = &slots[tid % 4];
        if (s->tid != tid) {
            s->tid = tid;
            gil_slot_reset(s);
        }
        char type[GIL_PARK_TYPE] = {0};
        if (kind == GIL_PARK_OBJECT)
            strcpy(type, "list");
        switch (event) {
        case 'P': gil_on_park(s, now, kind, 0x1000 + kind, type); break;
        case 'U': gil_on_unpark(&h, s, now); break;
        case 'X': gil_on_exit(&h, s); break;
        default: return 2;
        }
        const struct gil_long_park *lp = &s->park_ring[(s->long_parks - 1) & (GIL_PARK_RING_LEN - 1)];
        printf("seq=%llu open=%llu parks=%llu long_parks=%llu", (unsigned long long)s->seq,
               (unsigned long long)s->park_start_ns, (unsigned long long)s->parks, (unsigned long long)s->long_parks);
        for (int k = 0; k < GIL_PARK_KINDS; k++)
            printf(" parked%d=%llu exited%d=%llu", k, (unsigned long long)s->parked_ns[k], k,
                   (unsigned long long)h.exited_parked_ns[k]);
        printf(" lp_start=%llu lp_end=%llu lp_kind=%u lp_type=%s\n", (unsigned long long)lp->start_ns,
               (unsigned long long)lp->end_ns, lp->kind, s->long_parks && lp->type[0] ? lp->type : "-");
        fflush(stdout);
    }
    return 0;
}
"""


@pytest.fixture(scope="module")
def writer(tmp_path_factory):
    run_harness = harness(tmp_path_factory.mktemp("parks"), HARNESS)

    def run(events: list) -> list[dict]:
        out = run_harness("".join(f"{t} {e} {n} {k}\n" for t, e, n, k in events))
        states = [dict(kv.split("=") for kv in line.split()) for line in out.splitlines()]
        assert len(states) == len(events)
        assert all(int(state["seq"]) % 2 == 0 for state in states)
        return states

    return run


def test_parks_add_to_their_kind_and_long_ones_are_kept_with_the_type(writer):
    """A 2 ms critical section on a list, a 0.5 ms stop-the-world, a 3 ms app lock."""
    states = writer([(1, "P", 1000, ring.PARK_OBJECT), (1, "U", 2 * MS + 1000, 0),
                     (1, "P", 3 * MS, ring.PARK_STW), (1, "U", 3 * MS + MS // 2, 0),
                     (1, "P", 4 * MS, ring.PARK_APP_LOCK), (1, "U", 7 * MS, 0)])
    opened, section, _, stw, _, lock = states
    assert opened["open"] == "1000" and opened["parks"] == "0"
    assert (section["parked1"], section["long_parks"], section["lp_type"], section["open"]) == (str(2 * MS), "1", "list", "0")
    assert (stw["parked0"], stw["long_parks"]) == (str(MS // 2), "1")  # short: not in the ring
    assert (lock["parked2"], lock["parks"], lock["long_parks"], lock["lp_kind"], lock["lp_type"]) == \
        (str(3 * MS), "3", "2", str(ring.PARK_APP_LOCK), "-")
    assert (lock["lp_start"], lock["lp_end"]) == (str(4 * MS), str(7 * MS))


def test_an_unpark_with_no_park_open_changes_nothing(writer):
    state = writer([(2, "U", 5 * MS, 0)])[0]
    assert (state["parks"], state["seq"]) == ("0", "2")  # the claim's reset only


def test_an_exit_folds_parked_time_into_the_header(writer):
    states = writer([(3, "P", MS, ring.PARK_INTERNAL), (3, "U", 5 * MS, 0), (3, "X", 6 * MS, 0)])
    assert states[-1]["exited3"] == str(4 * MS)

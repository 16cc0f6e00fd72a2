/* A span's gil.* figures from its thread's counters: spans.own_figures in C, the one
 * computation _fastspan.c's hooks use (and tests/unit/test_differential.py holds
 * against the Python reference).
 */
#ifndef OTEL_GIL_SPAN_FIGURES_H
#define OTEL_GIL_SPAN_FIGURES_H

#include "fastspan.h"

/* How far wait + hold may pass a span's duration (the clocks' reads around it): spans.CLOCK_SLACK_NS. */
#define CLOCK_SLACK_NS 50000

struct figures {
	uint64_t wait, hold, acquisitions, convoy;
	uint64_t others; /* gil.others_hold_ms, where the home thread switched contexts */
};

/* The figures of a span whose home thread's counters were c0 at its start and c1 at its
 * end, duration ns long (>= 1): 1 with *out set, 0 where the Python hook decides (figures
 * that break an invariant: dropped; or a gil.status to give instead of them).
 * own: what its own code did, NULL where contexts are not tracked; switched: its home
 * thread switched contexts meanwhile; untracked: not tracked throughout, and its code
 * ran among other contexts' or on other threads (switched, or own->threads_else). */
static inline int span_figures(const struct counters *c0, const struct counters *c1, const struct own *o,
			       int switched, int untracked, long long duration, struct figures *out)
{
	if (c1->wait_ns < c0->wait_ns || c1->hold_ns < c0->hold_ns || c1->acquisitions < c0->acquisitions ||
	    c1->convoy_waits < c0->convoy_waits)
		return 0;
	uint64_t d_wait = c1->wait_ns - c0->wait_ns, d_hold = c1->hold_ns - c0->hold_ns;
	*out = (struct figures){d_wait, d_hold, c1->acquisitions - c0->acquisitions, c1->convoy_waits - c0->convoy_waits, 0};
	if (o != NULL) {
		if (o->flags || untracked)
			return 0; /* unseen switches, a missing charge, untracked for a while: the Python hook says so */
		if (switched) {
			if (o->hold_home > d_hold)
				return 0;
			out->others = d_hold - o->hold_home;
			out->hold = o->hold_home;
			out->acquisitions = o->acquisitions_home;
		}
		if (o->threads_else != OWN_MANY &&
		    o->wait_else + o->hold_else > (uint64_t)duration * o->threads_else + CLOCK_SLACK_NS)
			return 0;
		out->wait += o->wait_else;
		out->hold += o->hold_else;
		out->acquisitions += o->acquisitions_else;
		out->convoy += o->convoy_else;
	}
	return d_wait + d_hold <= (uint64_t)duration + CLOCK_SLACK_NS;
}

#endif

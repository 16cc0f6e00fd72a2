/* What a writer of the slot layout (gil_layout.h) does on each GIL event: the
 * one definition both writers compile, the collector's BPF program
 * (collector/otel_gil_collector/gil.bpf.c) and the in-process hooks (otel_gil/_inprocess.c).
 *
 * The events, as a writer sees them (FORCE_SWITCHING, every CPython 3.9-3.15):
 *   RELEASE  pthread_cond_signal(&gil->cond)        in drop_gil
 *   ACQUIRE  pthread_cond_signal(&gil->switch_cond) in take_gil, once it holds the GIL
 *   WAIT     pthread_cond_timedwait(&gil->cond)     in take_gil's loop while the GIL is
 *            taken: each call (the first of an episode, and one more per timeout)
 * A writer acts at the call's entry, before the libc call runs. All three run
 * under gil->mutex, so events are serialized across threads: the header's
 * process-wide fields need no atomic read-modify-write. A slot is written only
 * by its own thread, each event's writes between two GIL_SEQ_BUMPs (odd while
 * writing). EXIT (the includer's hook on a thread's exit) frees the slot, then
 * adds its figures to h->exited_*.
 *
 * Forced switches: a holder asked to drop the GIL (the eval loop) releases it and
 * calls take_gil at once; until the taker has it, it may block in drop_gil on
 * switch_cond, and on a busy machine it is often preempted as it wakes the taker
 * (measured: 2-3 ms per switch on a loaded 2-core VM, switch_cond waited on in a
 * quarter of the switches). Its wait counts from the release (FORCED in
 * gil_on_release). A wait opened at a release that was voluntary
 * (Py_BEGIN_ALLOW_THREADS with a request pending) is dropped at the thread's next
 * WAIT or ACQUIRE unless no other thread took the GIL in between; if none did,
 * the I/O ended while the GIL was still held by the thread it let in, and the
 * whole stretch counts as a wait (at most the taker's hold). While
 * GIL_SLOT_UNCHECKED is set, readers do not count the open wait.
 * convoy_waits counts waits of at least the switch interval (h->convoy_ns),
 * forced or not: each is a thread kept off the GIL for a whole interval or more.
 *
 * Parks (a free-threaded build running without its GIL): a thread sleeps in CPython's
 * parking lot through one libc call (sem_clockwait/sem_timedwait/sem_wait on glibc), made
 * by the thread itself; a writer sees both of its ends:
 *   PARK     the call's entry: what it parks on (an address, classified GIL_PARK_*)
 *   UNPARK   its return
 * A thread's parks never nest, and only the thread writes its slot, between seq bumps.
 * A reader closes an open park at its own "now" (park_start_ns != 0), as an open wait.
 *
 * The includer defines, before including this file:
 *   GIL_INLINE                 how these functions are declared (static, always inlined)
 *   GIL_SEQ_BUMP(s)            one increment of s->seq, ordered against the slot's other stores
 *   GIL_HOLD_PAGE(slots, i)    a pointer to hold-log page i (struct gil_hold_page *), or NULL
 *   GIL_PUBLISH(p, v)          a release store of v to the __u64 at p
 *   GIL_LOG2(x)                floor(log2(x)) of a __u64 x > 0
 *   GIL_ATOMIC_ADD(p, v)       an atomic add of v to the __u64 at p (threads exit concurrently)
 *   GIL_FREE_SLOT(s)           one store of 0 to s's tid and flags (the 8-byte word they share)
 *   GIL_WHERE                  the type of the includer's own argument of RELEASE, passed on
 *   GIL_LOCATE(slots, h, n, tstate, where)  record where the releasing thread's Python code is
 *                              as hold n of the hold log is released (tstate: its slot's):
 *                              gil_locate() into that hold's struct gil_location
 * and gil_location.h before this file (gil_acquired_for).
 */
#ifndef OTEL_GIL_WRITER_H
#define OTEL_GIL_WRITER_H

#include "gil_layout.h"

/* A slot claimed by a thread starts from zero (tid and flags are set by the claim). */
GIL_INLINE void gil_slot_reset(struct gil_slot *s)
{
	GIL_SEQ_BUMP(s);
	s->wait_ns = 0;
	s->hold_ns = 0;
	s->acquisitions = 0;
	s->convoy_waits = 0;
	s->long_waits = 0;
	s->long_holds = 0;
	s->wait_start_ns = 0;
	s->acquired_ns = 0;
	s->wait_mark_ns = 0;
	s->wait_acq_mark = 0;
	s->forced_waits = 0;
	s->forced_acq_mark = 0;
	s->tstate = 0;
	__builtin_memset(s->hist, 0, sizeof(s->hist));
	__builtin_memset(s->parked_ns, 0, sizeof(s->parked_ns));
	s->parks = 0;
	s->park_start_ns = 0;
	s->long_parks = 0;
	GIL_SEQ_BUMP(s);
}

/* Append a hold to the process's hold log: the record first, then the count
 * that publishes it (readers trust records below the count they read); then
 * where the releasing thread's code was (its struct gil_location). */
GIL_INLINE void gil_log_hold(void *slots, struct gil_header *h, __u64 tstate, __u32 tid, __u64 start, __u64 end,
				GIL_WHERE where)
{
	__u64 n = h->holds_written;
	__u32 pos = n & (GIL_HOLD_LOG_LEN - 1);
	struct gil_hold_page *page = GIL_HOLD_PAGE(slots, pos / GIL_HOLDS_PER_PAGE);
	if (!page)
		return;
	struct gil_hold *rec = &page->holds[pos & (GIL_HOLDS_PER_PAGE - 1)];
	rec->start_ns = start;
	rec->end_ns = end;
	rec->tid = tid;
	GIL_PUBLISH(&h->holds_written, n + 1);
	GIL_LOCATE(slots, h, n, tstate, where);
}

/* RELEASE: close the hold (and log it); a release while take_gil has asked the
 * holder to drop the GIL (h->drop_request) opens the thread's own wait. */
GIL_INLINE void gil_on_release(void *slots, struct gil_header *h, struct gil_slot *s, __u32 tid, __u64 now,
				GIL_WHERE where)
{
	GIL_SEQ_BUMP(s);
	if (s->acquired_ns) {
		__u64 hold = now - s->acquired_ns;
		s->hold_ns += hold;
		h->held_total_ns += hold;
		if (hold >= h->long_hold_ns) {
			struct gil_long_hold *lh = &s->hold_ring[s->long_holds & (GIL_RING_LEN - 1)];
			lh->start_ns = s->acquired_ns;
			lh->end_ns = now;
			s->long_holds++;
		}
		if (hold >= h->hold_record_ns)
			gil_log_hold(slots, h, s->tstate, tid, s->acquired_ns, now, where);
		s->acquired_ns = 0;
	}
	if (h->drop_request && !s->wait_start_ns) { /* FORCED */
		s->wait_start_ns = now;
		s->wait_mark_ns = h->held_total_ns;
		s->forced_acq_mark = h->acquisitions_total;
		s->flags |= GIL_SLOT_FORCED | GIL_SLOT_UNCHECKED;
	}
	GIL_SEQ_BUMP(s);
	h->last_release_tid = tid;
	h->holder_tid = 0;
}

/* STALE_CHECK (the first WAIT or ACQUIRE after a FORCED release): the wait
 * stands if the thread came straight back for the GIL (no other thread took it
 * after the one it let in); otherwise the release was voluntary and is no wait.
 * Runs between the slot's seq bumps. */
GIL_INLINE void gil_stale_check(struct gil_header *h, struct gil_slot *s)
{
	if (!(s->flags & GIL_SLOT_UNCHECKED))
		return;
	s->flags &= ~GIL_SLOT_UNCHECKED;
	if (h->acquisitions_total - s->forced_acq_mark > 1) {
		s->wait_start_ns = 0;
		s->flags &= ~GIL_SLOT_FORCED;
	}
}

/* ACQUIRE: close the wait (histogram, convoy, the long-wait ring with who held
 * the GIL meanwhile), open the hold. */
GIL_INLINE void gil_on_acquire(struct gil_header *h, struct gil_slot *s, __u32 tid, __u64 now)
{
	GIL_SEQ_BUMP(s);
	gil_stale_check(h, s);
	if (s->flags & GIL_SLOT_FORCED)
		s->forced_waits++;
	if (s->wait_start_ns) {
		__u64 wait = now - s->wait_start_ns;
		__u32 bucket = wait ? GIL_LOG2(wait) : 0;
		if (bucket >= GIL_HIST_BUCKETS)
			bucket = GIL_HIST_BUCKETS - 1;
		s->hist[bucket & (GIL_HIST_BUCKETS - 1)]++;
		s->wait_ns += wait;
		if (wait >= h->convoy_ns)
			s->convoy_waits++;
		if (wait >= h->long_wait_ns) {
			struct gil_long_wait *lw = &s->ring[s->long_waits & (GIL_RING_LEN - 1)];
			__u64 held = h->held_total_ns - s->wait_mark_ns;
			lw->start_ns = s->wait_start_ns;
			lw->end_ns = now;
			lw->blocker_tid = h->last_release_tid;
			lw->flags = s->flags & GIL_SLOT_FORCED ? GIL_WAIT_FORCED : 0;
			lw->held_ns = (__s64)held < 0 ? 0 : held > wait ? wait : held;
			s->long_waits++;
		}
		s->wait_start_ns = 0;
	}
	s->acquisitions++;
	s->acquired_ns = now;
	s->tstate = gil_acquired_for(h);
	s->flags &= ~(GIL_SLOT_IN_TAKE_GIL | GIL_SLOT_FORCED);
	GIL_SEQ_BUMP(s);
	h->holder_tid = tid;
	h->last_acquired_ns = now;
	h->acquisitions_total++;
	h->drop_request = 0; /* take_gil resets a pending drop request */
}

/* WAIT: open the wait (with the process's held time so far, for blame). A second
 * wait of one episode with no acquisition since the first means the first timed
 * out with the holder unchanged: take_gil then asks the holder to drop the GIL
 * (SET_GIL_DROP_REQUEST). */
GIL_INLINE void gil_on_wait(struct gil_header *h, struct gil_slot *s, __u64 now)
{
	__u64 acquisitions = h->acquisitions_total;
	int again = s->wait_start_ns && !(s->flags & GIL_SLOT_UNCHECKED);
	GIL_SEQ_BUMP(s);
	gil_stale_check(h, s);
	if (!s->wait_start_ns) {
		s->wait_start_ns = now;
		s->wait_mark_ns = h->held_total_ns +
				  (h->holder_tid && now > h->last_acquired_ns ? now - h->last_acquired_ns : 0);
	} else if (again && s->wait_acq_mark == acquisitions) {
		h->drop_request = 1;
	}
	s->wait_acq_mark = acquisitions;
	GIL_SEQ_BUMP(s);
}

/* PARK: open a park on `addr`, of kind `kind` (GIL_PARK_*), with its object's type name
 * (GIL_PARK_TYPE bytes, NUL-padded; GIL_PARK_OBJECT only, else all zero). */
GIL_INLINE void gil_on_park(struct gil_slot *s, __u64 now, __u32 kind, __u64 addr, const char *type)
{
	GIL_SEQ_BUMP(s);
	s->park_start_ns = now;
	s->park_addr = addr;
	s->park_kind = kind < GIL_PARK_KINDS ? kind : GIL_PARK_OTHER;
	__builtin_memcpy(s->park_type, type, GIL_PARK_TYPE);
	GIL_SEQ_BUMP(s);
}

/* UNPARK: close the open park into its kind's total (and the long-park ring). */
GIL_INLINE void gil_on_unpark(struct gil_header *h, struct gil_slot *s, __u64 now)
{
	if (!s->park_start_ns)
		return;
	__u64 parked = now > s->park_start_ns ? now - s->park_start_ns : 0;
	__u32 kind = s->park_kind < GIL_PARK_KINDS ? s->park_kind : GIL_PARK_OTHER;
	GIL_SEQ_BUMP(s);
	s->parked_ns[kind] += parked;
	s->parks++;
	if (parked >= h->long_wait_ns) {
		struct gil_long_park *lp = &s->park_ring[s->long_parks & (GIL_PARK_RING_LEN - 1)];
		lp->start_ns = s->park_start_ns;
		lp->end_ns = now;
		lp->addr = s->park_addr;
		lp->kind = kind;
		lp->reserved = 0;
		__builtin_memcpy(lp->type, s->park_type, GIL_PARK_TYPE);
		s->long_parks++;
	}
	s->park_start_ns = 0;
	GIL_SEQ_BUMP(s);
}

/* EXIT: free the slot (one store: no seq bump that a thread claiming it next
 * could interleave with), then add its totals between exits_started and
 * exited_threads: a reader that finds the two equal read no exit half-added
 * (otel_gil/metrics.py), and one that reads the header before the slots never
 * counts this thread twice. */
GIL_INLINE void gil_on_exit(struct gil_header *h, struct gil_slot *s)
{
	__u64 wait = s->wait_ns, hold = s->hold_ns, acquisitions = s->acquisitions, convoy = s->convoy_waits;
	__u64 parked[GIL_PARK_KINDS];
	__builtin_memcpy(parked, s->parked_ns, sizeof(parked));
	GIL_FREE_SLOT(s);
	GIL_ATOMIC_ADD(&h->exits_started, 1);
	GIL_ATOMIC_ADD(&h->exited_wait_ns, wait);
	GIL_ATOMIC_ADD(&h->exited_hold_ns, hold);
	GIL_ATOMIC_ADD(&h->exited_acquisitions, acquisitions);
	GIL_ATOMIC_ADD(&h->exited_convoy_waits, convoy);
	for (int k = 0; k < GIL_PARK_KINDS; k++)
		GIL_ATOMIC_ADD(&h->exited_parked_ns[k], parked[k]);
	GIL_ATOMIC_ADD(&h->exited_threads, 1);
}

#endif

/* The C half of the shared-memory layout (the Python half is otel_gil/ring.py).
 *
 * One BPF array per registered process, created BPF_F_MMAPABLE: entry 0 holds
 * struct gil_header, entries 1..nslots hold one struct gil_slot per thread,
 * found by tid with open addressing. Every entry is sizeof(struct gil_slot)
 * bytes. All times are CLOCK_MONOTONIC nanoseconds (bpf_ktime_get_ns). Thread
 * ids are as the process sees them, in its own pid namespace (a container's).
 * tests/unit/test_layout.py compiles this file and checks both halves agree.
 *
 * After the slots, entries nslots+1 .. nslots+GIL_HOLD_PAGES hold the process's
 * hold log (struct gil_hold_page): the recent GIL holds of every thread, for
 * blame by time held (which threads held the GIL during a long wait).
 *
 * Two writers fill this layout: the collector (collector/gil.bpf.c, eBPF
 * uprobes) and the in-process backend. Both hook the same libc calls and must
 * keep the same semantics; the comments on each field say who writes it and
 * when. The events, as seen by a writer (x86_64 glibc, FORCE_SWITCHING, CPython
 * 3.9-3.13):
 *   RELEASE     pthread_cond_signal(&gil->cond)        in drop_gil, under gil->mutex
 *   ACQUIRE     pthread_cond_signal(&gil->switch_cond) in take_gil, under gil->mutex
 *   WAIT        pthread_cond_timedwait(&gil->cond)     in take_gil, under gil->mutex
 *               (every call of the loop; only the first of an episode counts)
 *   FORCED_WAIT pthread_cond_wait(&gil->switch_cond)   in drop_gil, right after this
 *               thread's RELEASE, when a drop request is pending and no one has taken
 *               the GIL yet; under gil->switch_mutex only. Also after a voluntary
 *               release (Py_BEGIN_ALLOW_THREADS with a drop request pending): then the
 *               thread goes on to its I/O once woken, not to take_gil; the writer tells
 *               the two apart by the thread's voluntary context switches (nvcsw: the
 *               kernel's task->nvcsw, or getrusage(RUSAGE_THREAD).ru_nvcsw): a forced
 *               drop blocks at most once (in this wait) before its take_gil, an I/O
 *               call that blocked adds one more.
 *   EXIT        the thread exits (collector: sched_process_exit)
 * RELEASE, ACQUIRE and WAIT run under gil->mutex, so they are serialized across
 * threads: the header's process-wide fields marked "gil->mutex" need no atomic
 * read-modify-write. FORCED_WAIT touches only the thread's own slot. A writer
 * acts at the call's entry, before the libc call runs; now = CLOCK_MONOTONIC ns.
 * s = the calling thread's slot (claimed and zeroed on its first event), each
 * event's slot writes between two increments of s->seq.
 *
 *   RELEASE:     if s->acquired_ns: hold = now - s->acquired_ns; s->hold_ns += hold;
 *                  h->held_total_ns += hold; hold >= h->long_hold_ns: s->hold_ring entry;
 *                  hold >= h->hold_record_ns: hold log record {acquired_ns, now, tid},
 *                  then h->holds_written += 1 (release store); s->acquired_ns = 0.
 *                s->released_ns = now; s->released_mark_ns = h->held_total_ns;
 *                h->last_release_tid = tid; h->holder_tid = 0; h->holder_since_ns = 0.
 *   ACQUIRE:     STALE_CHECK; if s->flags & GIL_SLOT_FORCED: s->forced_waits++.
 *                if s->wait_start_ns: wait = now - s->wait_start_ns; hist, wait_ns,
 *                  convoy_waits (wait >= h->convoy_ns); wait >= h->long_wait_ns: s->ring
 *                  entry {wait_start_ns, now, h->last_release_tid,
 *                  flags = GIL_WAIT_FORCED if s->flags & GIL_SLOT_FORCED,
 *                  held_ns = h->held_total_ns - s->wait_mark_ns clamped to [0, wait]},
 *                  long_waits++;
 *                  s->wait_start_ns = 0. s->flags &= ~(GIL_SLOT_FORCED | GIL_SLOT_IN_TAKE_GIL);
 *                  (GIL_SLOT_UNCHECKED is already clear: STALE_CHECK ran first)
 *                s->acquisitions++; s->acquired_ns = now;
 *                h->holder_tid = tid; h->holder_since_ns = now.
 *   WAIT:        STALE_CHECK; if !s->wait_start_ns: s->wait_start_ns = now; s->wait_mark_ns =
 *                  h->held_total_ns + (h->holder_tid ? now - h->holder_since_ns : 0).
 *   FORCED_WAIT: if !s->wait_start_ns: s->wait_start_ns = s->released_ns (the forced
 *                  release); s->wait_mark_ns = s->released_mark_ns (if no release was
 *                  seen, released_ns == 0: now and h->held_total_ns instead);
 *                  s->flags |= GIL_SLOT_FORCED | GIL_SLOT_UNCHECKED; s->forced_nvcsw = nvcsw (now).
 *                (The thread blocks until another takes the GIL, then re-enters
 *                take_gil: its WAITs there keep this start; its ACQUIRE closes it.)
 *   STALE_CHECK: (the first WAIT or ACQUIRE after a FORCED_WAIT) if s->flags & GIL_SLOT_UNCHECKED:
 *                  clear it; if nvcsw (now) - s->forced_nvcsw > 1, the release was
 *                  voluntary and the thread blocked in its I/O since: s->wait_start_ns = 0;
 *                  s->flags &= ~GIL_SLOT_FORCED (no wait from it).
 *   EXIT:        add the slot's wait/hold/acquisitions/convoy_waits to h->exited_*
 *                (atomic adds), h->exited_threads++, after freeing the slot (tid = 0).
 *
 * convoy_waits thus counts waits of at least the switch interval, from WAIT or
 * from a forced release alike: each is a thread kept off the GIL for a whole
 * interval or more by other threads.
 */
#ifndef OTEL_GIL_LAYOUT_H
#define OTEL_GIL_LAYOUT_H

#define GIL_MAGIC 0x004c49474c45544fULL /* "OTELGIL\0", little-endian */
#define GIL_LAYOUT_VERSION 4
#define GIL_HIST_BUCKETS 32 /* bucket i counts waits in [2^i, 2^(i+1)) ns */
#define GIL_RING_LEN 16     /* long waits, and long holds, kept per thread */
#define GIL_PROBE_LEN 16    /* open-addressing window searched for a tid */
#define GIL_HOLD_LOG_LEN 4096  /* holds kept in the process's hold log (a power of 2) */
#define GIL_HOLDS_PER_PAGE 32  /* holds per array entry (a power of 2) */
#define GIL_HOLD_PAGES (GIL_HOLD_LOG_LEN / GIL_HOLDS_PER_PAGE)

#define GIL_SLOT_IN_TAKE_GIL 1 /* slot.flags: inside take_gil, cond addresses not yet learned */
#define GIL_SLOT_FORCED 2      /* slot.flags: the open wait began at a forced switch (FORCED_WAIT) */
#define GIL_SLOT_UNCHECKED 4   /* slot.flags: ... and STALE_CHECK has not run on it yet */
#define GIL_WAIT_FORCED 1      /* gil_long_wait.flags: this wait began at a forced switch */

struct gil_long_wait {
	__u64 start_ns;
	__u64 end_ns;
	__u32 blocker_tid; /* thread that released the GIL last before this acquisition */
	__u32 flags;       /* GIL_WAIT_*: GIL_SLOT_FORCED of the slot when the wait closed */
	__u64 held_ns;     /* time any thread held the GIL during the wait: header.held_total_ns at
	                    * ACQUIRE minus slot.wait_mark_ns, clamped to [0, end - start]; the rest
	                    * (end - start - held_ns) is hand-off: the GIL was free, the waiter not yet
	                    * running */
};

/* One hold of the hold log, written at RELEASE by the releasing thread when the
 * hold lasted at least header.hold_record_ns. */
struct gil_hold {
	__u64 start_ns; /* the holder's ACQUIRE (slot.acquired_ns) */
	__u64 end_ns;   /* its RELEASE */
	__u32 tid;      /* the holder */
	__u32 reserved; /* 0 */
};

/* Hold h (0, 1, 2, ... as counted by header.holds_written) lives in entry
 * nslots + 1 + (h % GIL_HOLD_LOG_LEN) / GIL_HOLDS_PER_PAGE, at index
 * h % GIL_HOLDS_PER_PAGE of that entry. */
struct gil_hold_page {
	struct gil_hold holds[GIL_HOLDS_PER_PAGE];
};

struct gil_long_hold {
	__u64 start_ns;
	__u64 end_ns;
};

struct gil_slot {
	__u64 seq;           /* odd while the BPF side writes this slot */
	__u32 tid;           /* owner thread (kernel tid); 0 = free */
	__u32 flags;         /* GIL_SLOT_* */
	__u64 wait_ns;       /* closed waits */
	__u64 hold_ns;       /* closed holds */
	__u64 acquisitions;
	__u64 convoy_waits;  /* waits >= header.convoy_ns */
	__u64 long_waits;    /* waits >= header.long_wait_ns ever; ring[long_waits % GIL_RING_LEN] is next */
	__u64 wait_start_ns; /* open wait: started at, 0 when not waiting */
	__u64 acquired_ns;   /* open hold: acquired at, 0 when not holding */
	__u32 hist[GIL_HIST_BUCKETS];
	struct gil_long_wait ring[GIL_RING_LEN];
	__u64 long_holds;    /* holds >= header.long_hold_ns ever; hold_ring[long_holds % GIL_RING_LEN] is next */
	struct gil_long_hold hold_ring[GIL_RING_LEN];
	/* Blame (layout 4). The slot is written only by its own thread, each event's
	 * writes between two seq increments (odd while writing), as for every field. */
	__u64 released_ns;      /* RELEASE: now (set on every release, held or not) */
	__u64 released_mark_ns; /* RELEASE: header.held_total_ns after this release added its hold */
	__u64 wait_mark_ns;     /* process-wide held time when the open wait started: at WAIT (first of
	                         * an episode) header.held_total_ns + (now - header.holder_since_ns if
	                         * header.holder_tid else 0); at FORCED_WAIT released_mark_ns */
	__u64 forced_waits;     /* waits that began at a forced release (counted at their ACQUIRE) */
	__u64 forced_nvcsw;     /* FORCED_WAIT: the thread's voluntary context switches then */
};

struct gil_header {
	__u64 magic;
	__u32 layout_version;
	__u32 slot_size;     /* bytes per entry, header entry included */
	__u32 nslots;        /* thread slots after the header entry */
	__u32 clock_id;      /* CLOCK_MONOTONIC */
	__u32 pid;           /* registered process, as the collector sees it */
	__u32 cond_stride;   /* &gil->switch_cond - &gil->cond for this libc */
	__u64 long_wait_ns;
	__u64 convoy_ns;
	__u64 pidns_dev;     /* the process's pid namespace: tids are read in it */
	__u64 pidns_ino;
	__u64 gil_cond;      /* learned address of gil->cond, 0 until learned */
	__u64 switch_cond;   /* learned address of gil->switch_cond */
	__u32 last_release_tid; /* RELEASE: the releasing thread (gil->mutex) */
	__u32 holder_tid;       /* ACQUIRE: the acquiring thread; RELEASE: 0 (gil->mutex) */
	__u64 slot_overflows; /* events dropped: no free slot in the probe window */
	__u64 exited_threads;  /* totals carried over from threads that exited */
	__u64 exited_wait_ns;
	__u64 exited_hold_ns;
	__u64 exited_acquisitions;
	__u64 exited_convoy_waits;
	__u64 long_hold_ns;
	/* Blame (layout 4); process-wide, written under gil->mutex (see the top). */
	__u64 holder_since_ns;  /* ACQUIRE: now; RELEASE: 0 */
	__u64 held_total_ns;    /* RELEASE: += the hold closed (now - slot.acquired_ns, if the ACQUIRE
	                         * was seen), before anything else of the release reads it */
	__u64 holds_written;    /* holds ever written to the hold log. RELEASE of a hold >= hold_record_ns:
	                         * write the record at holds_written % GIL_HOLD_LOG_LEN first, then store
	                         * holds_written + 1 with release ordering (a reader that read
	                         * holds_written = n before copying records and n2 after trusts
	                         * records n2 - GIL_HOLD_LOG_LEN + 1 .. n - 1: the writer may be
	                         * overwriting record n2 - GIL_HOLD_LOG_LEN) */
	__u64 hold_record_ns;   /* set at creation: shorter holds only add to held_total_ns */
};

#endif

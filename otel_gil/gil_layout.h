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
 * Two writers fill this layout: the collector (collector/otel_gil_collector/gil.bpf.c, eBPF
 * uprobes) and the in-process backend (otel_gil/_inprocess.c, GOT hooks). Both
 * hook the same libc calls and run the same event logic, gil_writer.h (beside this file),
 * which says what each event writes; the comments on the fields say when.
 */
#ifndef OTEL_GIL_LAYOUT_H
#define OTEL_GIL_LAYOUT_H

#define GIL_MAGIC 0x004c49474c45544fULL /* "OTELGIL\0", little-endian */
#define GIL_LAYOUT_VERSION 5
#define GIL_HIST_BUCKETS 32 /* bucket i counts waits in [2^i, 2^(i+1)) ns */
#define GIL_RING_LEN 16     /* long waits, and long holds, kept per thread */
#define GIL_PROBE_LEN 16    /* open-addressing window searched for a tid */
#define GIL_HOLD_LOG_LEN 4096  /* holds kept in the process's hold log (a power of 2) */
#define GIL_HOLDS_PER_PAGE 32  /* holds per array entry (a power of 2) */
#define GIL_HOLD_PAGES (GIL_HOLD_LOG_LEN / GIL_HOLDS_PER_PAGE)
#define GIL_HOLD_RECORD_NS 100000ULL /* header.hold_record_ns both writers set: holds logged one by one */

#define GIL_SLOT_IN_TAKE_GIL 1 /* slot.flags: inside take_gil, cond addresses not yet learned */
#define GIL_SLOT_FORCED 2      /* slot.flags: the open wait began at a requested release (FORCED) */
#define GIL_SLOT_UNCHECKED 4   /* slot.flags: ... and STALE_CHECK has not run on it yet (readers skip it) */
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
	/* Layout 4: blame and forced switches (what writes them: the top of this file). */
	__u64 wait_mark_ns;     /* process-wide held time (header.held_total_ns + the open hold's part)
	                         * when the open wait started: its held_ns is the difference at ACQUIRE */
	__u64 wait_acq_mark;    /* WAIT: header.acquisitions_total at this thread's latest WAIT */
	__u64 forced_waits;     /* waits that began at a requested release and stood (ACQUIRE) */
	__u64 forced_acq_mark;  /* RELEASE that opened a forced wait: header.acquisitions_total then */
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
	/* Layout 4: process-wide, written under gil->mutex (see the top). */
	__u64 last_acquired_ns;   /* ACQUIRE: now (the holder's since, while holder_tid != 0) */
	__u64 acquisitions_total; /* ACQUIRE: += 1 */
	__u64 held_total_ns;      /* RELEASE: += the hold it closed (if its ACQUIRE was seen) */
	__u64 drop_request;       /* WAIT: 1 when take_gil asks the holder to drop the GIL; ACQUIRE: 0 */
	__u64 holds_written;    /* holds ever written to the hold log. RELEASE of a hold >= hold_record_ns:
	                         * write the record at holds_written % GIL_HOLD_LOG_LEN first, then store
	                         * holds_written + 1 with release ordering (a reader that read
	                         * holds_written = n before copying records and n2 after trusts
	                         * records n2 - GIL_HOLD_LOG_LEN + 1 .. n - 1: the writer may be
	                         * overwriting record n2 - GIL_HOLD_LOG_LEN) */
	__u64 hold_record_ns;   /* set at creation: shorter holds only add to held_total_ns */
	/* Layout 5: a thread's exit adds its figures to exited_* between exits_started += 1
	 * and exited_threads += 1 (a reader trusts exited_* read between equal counts). */
	__u64 exits_started;
};

#endif

/* The C half of the shared-memory layout (the Python half is otel_gil/ring.py).
 *
 * One BPF array per registered process, created BPF_F_MMAPABLE: entry 0 holds
 * struct gil_header, entries 1..nslots hold one struct gil_slot per thread,
 * found by tid with open addressing. Every entry is sizeof(struct gil_slot)
 * bytes. All times are CLOCK_MONOTONIC nanoseconds (bpf_ktime_get_ns). Thread
 * ids are as the process sees them, in its own pid namespace (a container's).
 * tests/unit/test_layout.py compiles this file and checks both halves agree.
 */
#ifndef OTEL_GIL_LAYOUT_H
#define OTEL_GIL_LAYOUT_H

#define GIL_MAGIC 0x004c49474c45544fULL /* "OTELGIL\0", little-endian */
#define GIL_LAYOUT_VERSION 3
#define GIL_HIST_BUCKETS 32 /* bucket i counts waits in [2^i, 2^(i+1)) ns */
#define GIL_RING_LEN 16     /* long waits, and long holds, kept per thread */
#define GIL_PROBE_LEN 16    /* open-addressing window searched for a tid */

#define GIL_SLOT_IN_TAKE_GIL 1 /* slot.flags: inside take_gil, cond addresses not yet learned */

struct gil_long_wait {
	__u64 start_ns;
	__u64 end_ns;
	__u32 blocker_tid; /* thread that released the GIL last before this acquisition */
	__u32 reserved;
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
	__u32 last_release_tid;
	__u32 exits_started;   /* bumped before an exit's figures are added, exited_threads after */
	__u64 slot_overflows; /* events dropped: no free slot in the probe window */
	__u64 exited_threads;  /* totals carried over from threads that exited */
	__u64 exited_wait_ns;
	__u64 exited_hold_ns;
	__u64 exited_acquisitions;
	__u64 exited_convoy_waits;
	__u64 long_hold_ns;
};

#endif

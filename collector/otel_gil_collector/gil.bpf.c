/* GIL hand-off tracing for the processes registered with otel-gil-collector.
 *
 * What each event writes: otel_gil/gil_writer.h, which the in-process backend
 * compiles too. Probes (all attached per registered pid, never host-wide; one uretprobe):
 *   take_gil entry            bootstrap only: marks the thread until the GIL's
 *                             two condition variables are learned, then detached
 *   pthread_cond_signal       on gil->cond: release (drop_gil, even inlined), which
 *                             also records a logged hold's location (which code);
 *                             on gil->switch_cond: acquisition (take_gil)
 *   pthread_cond_timedwait    on gil->cond: a contended wait starts
 *   sched_process_exit        (raw tracepoint) a thread exits: fold its figures
 *                             into the header and free its slot
 * and, for `otel-gil report` on a free-threaded build running without its GIL only
 * (compiled in with -DGIL_PARKS: the daemon never times parks, see tracer.py):
 *   _PyParkingLot_Park        entry: a park on its addr opens (gil_writer.h: PARK);
 *                             return (a uretprobe): it closes (UNPARK), its time
 *                             added to its address's total in park_addrs
 *
 * GIL_NSLOTS is set by the collector (-DGIL_NSLOTS=...).
 */
#include <uapi/linux/ptrace.h>
#include "gil_layout.h"

/* Template for the per-process arrays (header, slots, hold log, locations); every inner map has its shape. */
BPF_F_TABLE("array", u32, struct gil_slot, slots_template, GIL_NSLOTS + 1 + GIL_HOLD_PAGES + GIL_LOC_LEN, BPF_F_MMAPABLE);

/* Registered tgid -> that process's slot array (the only pids we trace). */
BPF_HASH_OF_MAPS(procs, u32, "slots_template", GIL_MAX_PROCS);


/* A slot is written only by its own thread, under a seqlock the reader retries
 * on. On x86 (GIL_TSO, set by the collector) stores are not reordered, so a
 * compiler barrier around a plain increment suffices; elsewhere the atomic add
 * is the memory barrier. */
static __always_inline void seq_bump(struct gil_slot *s)
{
#ifdef GIL_TSO
	asm volatile("" ::: "memory");
	*(volatile u64 *)&s->seq = s->seq + 1;
	asm volatile("" ::: "memory");
#else
	__sync_fetch_and_add(&s->seq, 1);
#endif
}

/* The event logic both writers share (otel_gil/gil_writer.h), on this side's primitives. */
#define GIL_INLINE static __always_inline
#define GIL_SEQ_BUMP(s) seq_bump(s)
#define GIL_HOLD_PAGE(slots, i) hold_page(slots, i)
#define GIL_LOG2(x) (bpf_log2l(x) - 1) /* bcc's bpf_log2l is floor(log2) + 1 */
#define GIL_ATOMIC_ADD(p, v) __sync_fetch_and_add((p), (v))
#define GIL_FREE_SLOT(s) ({ asm volatile("" ::: "memory"); *(volatile u64 *)&(s)->tid = 0; asm volatile("" ::: "memory"); })
#ifdef GIL_TSO
#define GIL_PUBLISH(p, v) ({ asm volatile("" ::: "memory"); *(volatile u64 *)(p) = (v); })
#else
#define GIL_PUBLISH(p, v) __sync_fetch_and_add((p), 1)
#endif

static __always_inline struct gil_hold_page *hold_page(void *slots, u32 page)
{
	u32 idx = GIL_NSLOTS + 1 + page;
	return bpf_map_lookup_elem(slots, &idx);
}

#define GIL_READ(dst, n, src) bpf_probe_read_user((dst), (n), (void *)(src))
/* Bytes of a line table decoded: the innermost frame's, then the others'; a line past them is
 * unknown (of the standard library's functions, 98 % have tables of 512 bytes or less). */
#define GIL_LINES_MAX 2048
#define GIL_LINES_OUTER 256
#include "gil_lines.h"

/* Per CPU: the part of a line table being decoded, and the decoder's state. */
BPF_PERCPU_ARRAY(line_scratch, struct gil_lines_scratch, 1);

static __always_inline int line_of(const struct gil_py_layout *py, u64 code, long addr, u32 depth, int format)
{
	u32 zero = 0;
	struct gil_lines_scratch *scratch = line_scratch.lookup(&zero);
	if (!scratch)
		return -1;
	return gil_line_of(py, code, addr, format, depth ? GIL_LINES_OUTER : GIL_LINES_MAX, scratch);
}

/* RELEASE's own argument: the line-table format this program decodes (GIL_LINES_*). */
#define GIL_WHERE int
#define GIL_LINE(py, code, addr, depth, format) line_of((py), (code), (addr), (depth), (format))
#include "gil_location.h"

/* Where the releasing thread's code is, as hold `hold`'s location (under gil->mutex). */
static __always_inline void locate(void *slots, struct gil_header *h, u64 hold, u64 tstate, int format)
{
	u32 idx = GIL_NSLOTS + 1 + GIL_HOLD_PAGES + (hold & (GIL_LOC_LEN - 1));
	struct gil_location *loc = bpf_map_lookup_elem(slots, &idx);
	if (loc)
		gil_locate(h, loc, hold, tstate, format);
}

#define GIL_LOCATE(slots, h, n, tstate, format) locate((slots), (h), (n), (tstate), (format))
#include "gil_writer.h"

static __always_inline struct gil_header *header_of(void *slots)
{
	u32 zero = 0;
	return bpf_map_lookup_elem(slots, &zero);
}

/* The initial pid namespace's inode number (PROC_PID_INIT_INO): tids there are the kernel's. */
#define PIDNS_INIT_INO 0xEFFFFFFCULL

/* The current thread's id as the process sees it (its pid namespace); 0 if unknown. */
static __always_inline u32 ns_tid(struct gil_header *h, u64 pid_tgid)
{
	if (h->pidns_ino == PIDNS_INIT_INO)
		return (u32)pid_tgid;
	struct bpf_pidns_info ns = {};
	if (bpf_get_ns_current_pid_tgid(h->pidns_dev, h->pidns_ino, &ns, sizeof(ns)))
		return 0;
	return ns.pid;
}

/* The slot of tid, or NULL; never claims a free slot. */
static __always_inline struct gil_slot *slot_find(void *slots, u32 tid)
{
	for (u32 i = 0; i < GIL_PROBE_LEN; i++) {
		u32 idx = 1 + (tid + i) % GIL_NSLOTS;
		struct gil_slot *s = bpf_map_lookup_elem(slots, &idx);
		if (!s)
			return NULL;
		if (s->tid == tid)
			return s;
	}
	return NULL;
}

/* The slot of tid, claiming and zeroing a free one on the thread's first event. */
static __always_inline struct gil_slot *slot_get(void *slots, struct gil_header *h, u32 tid)
{
	u32 home = 1 + tid % GIL_NSLOTS;
	struct gil_slot *s = bpf_map_lookup_elem(slots, &home);
	if (s && s->tid == tid)
		return s;
	s = slot_find(slots, tid);
	if (s)
		return s;
	for (u32 i = 0; i < GIL_PROBE_LEN; i++) {
		u32 idx = 1 + (tid + i) % GIL_NSLOTS;
		s = bpf_map_lookup_elem(slots, &idx);
		if (!s)
			break;
		/* tid and flags share one 8-byte word: claim it only while both are 0. */
		if (s->tid == 0 && __sync_val_compare_and_swap((u64 *)&s->tid, 0, tid) == 0) {
			gil_slot_reset(s);
			return s;
		}
	}
	__sync_fetch_and_add(&h->slot_overflows, 1);
	return NULL;
}

/* The current thread's registered process (its header and slots) and its tid there; NULL if none. */
static __always_inline struct gil_header *current_proc(void **slots, u32 *tid)
{
	u64 pid_tgid = bpf_get_current_pid_tgid();
	u32 tgid = pid_tgid >> 32;
	void *found = procs.lookup(&tgid);
	if (!found)
		return NULL;
	struct gil_header *h = header_of(found);
	if (!h)
		return NULL;
	*tid = ns_tid(h, pid_tgid);
	if (!*tid)
		return NULL;
	*slots = found;
	return h;
}

/* Learn the GIL's condition variables (once per process), only from inside take_gil. */
static __always_inline int learn(void *slots, struct gil_header *h, u32 tid, u64 gil_cond)
{
	struct gil_slot *s = slot_find(slots, tid);
	if (!s || !(s->flags & GIL_SLOT_IN_TAKE_GIL))
		return 0;
	h->gil_cond = gil_cond;
	h->switch_cond = gil_cond + h->cond_stride;
	return 1;
}

int take_gil_entry(struct pt_regs *ctx)
{
	void *slots;
	u32 tid;
	struct gil_header *h = current_proc(&slots, &tid);
	if (!h || h->switch_cond)
		return 0;
	struct gil_slot *s = slot_get(slots, h, tid);
	if (s)
		s->flags |= GIL_SLOT_IN_TAKE_GIL;
	return 0;
}

/* pthread_cond_signal: a release or an acquisition. One program per line-table format (the
 * planner attaches the one of the process's CPython), each decoding only its own. */
static __always_inline int cond_signal(struct pt_regs *ctx, int format)
{
	void *slots;
	u32 tid;
	struct gil_header *h = current_proc(&slots, &tid);
	if (!h)
		return 0;
	u64 cond = PT_REGS_PARM1(ctx);
	/* Inside take_gil, the first signal is on switch_cond. */
	if (h->switch_cond == 0 && !learn(slots, h, tid, cond - h->cond_stride))
		return 0;
	if (cond != h->gil_cond && cond != h->switch_cond)
		return 0;
	struct gil_slot *s = slot_get(slots, h, tid);
	if (!s)
		return 0;
	u64 now = bpf_ktime_get_ns();
	if (cond == h->gil_cond)
		gil_on_release(slots, h, s, tid, now, format);
	else
		gil_on_acquire(h, s, tid, now);
	return 0;
}

int cond_signal_lnotab(struct pt_regs *ctx) { return cond_signal(ctx, GIL_LINES_LNOTAB); }
int cond_signal_pairs(struct pt_regs *ctx) { return cond_signal(ctx, GIL_LINES_PAIRS); }
int cond_signal_locations(struct pt_regs *ctx) { return cond_signal(ctx, GIL_LINES_LOCATIONS); }

int cond_timedwait(struct pt_regs *ctx)
{
	void *slots;
	u32 tid;
	struct gil_header *h = current_proc(&slots, &tid);
	if (!h)
		return 0;
	u64 cond = PT_REGS_PARM1(ctx);
	/* Inside take_gil, a contended wait is on gil->cond. */
	if (h->switch_cond == 0 && !learn(slots, h, tid, cond))
		return 0;
	if (cond != h->gil_cond)
		return 0;
	struct gil_slot *s = slot_get(slots, h, tid);
	if (s)
		gil_on_wait(h, s, bpf_ktime_get_ns());
	return 0;
}

#ifdef GIL_PARKS
/* Parks by address: (tgid, tid, address parked on) -> time parked there. User space says
 * what each address is (otel_gil_collector/parkkinds.py), from the process's memory; a park
 * this map has no room for counts in its slot's parked_ns[GIL_PARK_OTHER] only. */
struct park_key {
	u32 tgid;
	u32 tid;
	u64 addr;
};
struct park_total {
	u64 ns;
	u64 parks;
};
BPF_HASH(park_addrs, struct park_key, struct park_total, 16384);

/* The current thread's slot in its registered process (claimed on its first event if `claim`),
 * and that process's header; NULL if none. */
static __always_inline struct gil_slot *current_slot(struct gil_header **h, int claim)
{
	void *slots;
	u32 tid;
	*h = current_proc(&slots, &tid);
	if (!*h)
		return NULL;
	return claim ? slot_get(slots, *h, tid) : slot_find(slots, tid);
}

/* _PyParkingLot_Park(addr, ...): a park on addr opens (its kind left to user space). */
int park_entry(struct pt_regs *ctx)
{
	struct gil_header *h;
	struct gil_slot *s = current_slot(&h, 1);
	char none[GIL_PARK_TYPE] = {};
	if (s)
		gil_on_park(s, bpf_ktime_get_ns(), GIL_PARK_OTHER, PT_REGS_PARM1(ctx), none);
	return 0;
}

/* Its return: the park closes, its time added to its address's total. */
int park_return(struct pt_regs *ctx)
{
	struct gil_header *h;
	struct gil_slot *s = current_slot(&h, 0);
	if (!s || !s->park_start_ns)
		return 0;
	u64 now = bpf_ktime_get_ns();
	struct park_key key = {bpf_get_current_pid_tgid() >> 32, s->tid, s->park_addr};
	struct park_total zero = {}, *total = park_addrs.lookup_or_try_init(&key, &zero);
	if (total && now > s->park_start_ns) {
		__sync_fetch_and_add(&total->ns, now - s->park_start_ns);
		__sync_fetch_and_add(&total->parks, 1);
	}
	gil_on_unpark(h, s, now);
	return 0;
}
#endif /* GIL_PARKS */

RAW_TRACEPOINT_PROBE(sched_process_exit)
{
	void *slots;
	u32 tid;
	struct gil_header *h = current_proc(&slots, &tid);
	if (!h)
		return 0;
	struct gil_slot *s = slot_find(slots, tid);
	if (!s)
		return 0;
	gil_on_exit(h, s);
	return 0;
}

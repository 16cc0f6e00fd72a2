/* The in-process writer of the slot layout: GIL hand-offs traced from inside the
 * app, with no privilege and no collector.
 *
 * The interpreter calls pthread_cond_signal and pthread_cond_timedwait through
 * its GOT. install() swaps those GOT entries for the wrappers below (got_patch.c;
 * `hooked` is the table of them), and learns the GIL's two condition variables
 * from a Py_BEGIN/END_ALLOW_THREADS of its own. From then on the
 * wrappers run the collector's event logic (otel_gil/gil_writer.h, the same
 * code its BPF program compiles) into the same layout (otel_gil/gil_layout.h),
 * in this process's own memory:
 *   pthread_cond_signal(&gil->cond)         a release (drop_gil, even inlined)
 *   pthread_cond_signal(&gil->switch_cond)  an acquisition (take_gil)
 *   pthread_cond_timedwait(&gil->cond)      a contended wait, each call of it
 *   pthread key destructor                  a thread exits: fold its figures
 * The wrappers then call the real function (got_patch.h says where from).
 *
 * On a free-threaded build running without its GIL, install_parks() also swaps
 * libpython's sem_clockwait/sem_timedwait/sem_wait, the calls a thread parks with
 * (CPython's parking lot on glibc), for wrappers that time each park around the real
 * call (gil_writer.h: PARK, UNPARK) and say what it parked on (park_kind.h).
 *
 * A logged hold also records where the releasing thread's Python code was
 * (otel_gil/gil_location.h, the collector's code too), read with plain loads
 * through the struct offsets of otel_gil/pystructs.py: set_layout() takes them
 * only once locate_self() read this thread's own frames through them with reads
 * that cannot fault (a pipe), and the caller found them right.
 *
 * Each slot is written only by its own thread, under the seqlock readers retry
 * on. The ring is allocated once per process and never freed, so a reader or a
 * wrapper still running across uninstall() never touches unmapped memory.
 *
 * The wrappers never needed the GIL (a GIL waiter runs them without it). The calls
 * from Python run one at a time: under the GIL, or on a free-threaded build under
 * api_lock, so the module is declared safe without a GIL (Py_MOD_GIL_NOT_USED) and
 * importing it there leaves the GIL off.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "py_versions.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <linux/types.h> /* the __u32/__u64 of gil_layout.h */
#include <pthread.h>
#include <semaphore.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "clock_ns.h"
#include "gil_layout.h"
#include "got_patch.h"
#include "py_versions.h"

#if !defined(__x86_64__) && !defined(__aarch64__)
#error "otel_gil._inprocess knows the GOT relocations of x86_64 and aarch64 only"
#endif

#define COND_STRIDE (sizeof(pthread_cond_t) + sizeof(pthread_mutex_t)) /* &gil->switch_cond - &gil->cond */

typedef int (*signal_fn)(pthread_cond_t *);
typedef int (*timedwait_fn)(pthread_cond_t *, pthread_mutex_t *, const struct timespec *);

/* ------------------------------------------------------------ the ring */

static char *ring;      /* header entry, nslots slots, the hold log; allocated once, never freed */
static size_t ring_size;
static uint32_t nslots;

static inline struct gil_header *header(void) { return (struct gil_header *)ring; }

static inline struct gil_slot *slot_at(uint32_t index) /* 0-based thread slot */
{
	return (struct gil_slot *)(ring + (size_t)(index + 1) * sizeof(struct gil_slot));
}

/* ------------------------------------------------------ writer state */

static signal_fn real_signal;
static timedwait_fn real_timedwait;
static pthread_cond_t *gil_cond, *switch_cond; /* learned; NULL until then */
static volatile int active;                   /* record hand-offs (between install and uninstall) */
static volatile unsigned epoch = 1;           /* bumped at install and in a forked child */
static unsigned long forks;                   /* fork()s this process came out of (any caller) */
static pthread_key_t exit_key;                /* its destructor folds an exiting thread's figures */

/* Learning: the installing thread's own signals while it drops and retakes the GIL. */
static volatile pid_t learner;
static pthread_cond_t *learned[2];
static int nlearned;

/* The calling thread's id (as the process sees it), slot and whether `waiting` counts it,
 * valid for one epoch. initial-exec: a fixed offset from the thread pointer, no
 * __tls_get_addr call on the hot path (24 bytes of the static TLS that glibc reserves for dlopen). */
static __thread __attribute__((tls_model("initial-exec"))) struct {
	unsigned epoch;
	pid_t tid;
	struct gil_slot *slot;
	int waiting;
} me;

/* Threads of this epoch whose wait is open (from a WAIT, or a forced release, to their next
 * acquisition). A hold released while there are none blocked nobody, and no blame reads where its
 * code was: a wait that overlaps a hold is still open as the hold is released. So locate() skips
 * it (an event loop's thread alone drops the GIL at each poll, after holds often past
 * GIL_HOLD_RECORD_NS). Changed under gil->mutex but by an exiting thread's hook: atomic. */
static struct {
	unsigned epoch;
	long threads;
} waiting;

/* After a WAIT or RELEASE: the thread counts as waiting if its slot's wait is open. */
static inline void note_wait(const struct gil_slot *s)
{
	if (!s->wait_start_ns || me.waiting)
		return;
	if (waiting.epoch != epoch) { /* the first of this epoch: those of the one before were dropped */
		waiting.epoch = epoch;
		waiting.threads = 0;
	}
	me.waiting = 1;
	__atomic_fetch_add(&waiting.threads, 1, __ATOMIC_RELAXED);
}

/* After an ACQUIRE, or as the thread exits: its wait is over. */
static inline void note_no_wait(void)
{
	if (!me.waiting)
		return;
	me.waiting = 0;
	if (waiting.epoch == epoch)
		__atomic_fetch_sub(&waiting.threads, 1, __ATOMIC_RELAXED);
}

/* One seqlock step: odd while the slot is being written. Only the owner thread
 * writes its slot, so a plain increment is safe; the fences order the slot's
 * data stores against it for a reader on another core. */
static inline void seq_bump(struct gil_slot *s)
{
	__atomic_thread_fence(__ATOMIC_RELEASE);
	__atomic_store_n(&s->seq, s->seq + 1, __ATOMIC_RELAXED);
	__atomic_thread_fence(__ATOMIC_RELEASE);
}

static inline struct gil_hold_page *hold_page(void *slots, unsigned page)
{
	(void)slots;
	return (struct gil_hold_page *)(ring + (size_t)(1 + nslots + page) * sizeof(struct gil_slot));
}

/* tid and flags share one 8-byte word: the slot is free while both are 0. */
static inline uint64_t *owner_word(struct gil_slot *s) { return (uint64_t *)&s->tid; }

/* Reads of the interpreter's memory for a location: plain loads, except while
 * locate_self() checks a layout, when a bad address fails instead of faulting. */
static int checking = -1; /* a pipe's write end while locate_self() runs, else -1 */
static int check_reads;   /* its read end */

static int checked_read(void *dst, size_t n, uint64_t src)
{
	if (write(checking, (const void *)(uintptr_t)src, n) != (ssize_t)n)
		return -1; /* EFAULT: not mapped */
	return read(check_reads, dst, n) == (ssize_t)n ? 0 : -1;
}

static inline int read_memory(void *dst, size_t n, uint64_t src)
{
	if (__builtin_expect(checking >= 0, 0))
		return checked_read(dst, n, src);
	memcpy(dst, (const void *)(uintptr_t)src, n);
	return 0;
}

/* Lines of logged holds' frames, remembered: PyCode_Addr2Line decodes the line table
 * from its start (thousands of instructions in a long function such as the event loop's
 * _run_once, four frames a hold). An entry answers only for the same code address,
 * offset and table object whose bytes and first line are still those it was computed
 * from (a copy is compared), so a code object freed and another made at its address is
 * decoded anew. Used under the main GIL's mutex (drop_gil): one thread at a time. */
#define LINES_BITS 6
#define LINES_LEN (1 << LINES_BITS) /* entries */
#define LINES_TABLE 1024     /* longest line table remembered, bytes */
static struct {
	const PyCodeObject *code;
	int addr, line, firstlineno;
	const PyObject *table;
	Py_ssize_t size;
	char bytes[LINES_TABLE];
} lines[LINES_LEN];

static int line_of(PyCodeObject *code, int addr)
{
#if PY_3_10_OR_LATER
	PyObject *table = code->co_linetable;
#else
	PyObject *table = code->co_lnotab;
#endif
	if (table == NULL || !PyBytes_CheckExact(table) || PyBytes_GET_SIZE(table) > LINES_TABLE)
		return PyCode_Addr2Line(code, addr);
	Py_ssize_t size = PyBytes_GET_SIZE(table);
	uint64_t key = ((uint64_t)(uintptr_t)code ^ (uint64_t)addr << 40) * 0x9E3779B97F4A7C15ULL;
	typeof(lines[0]) *e = &lines[key >> (64 - LINES_BITS)];
	if (e->code == code && e->addr == addr && e->table == table && e->size == size &&
	    e->firstlineno == code->co_firstlineno && !memcmp(e->bytes, PyBytes_AS_STRING(table), size))
		return e->line;
	int line = PyCode_Addr2Line(code, addr);
	e->code = code;
	e->addr = addr;
	e->line = line;
	e->firstlineno = code->co_firstlineno;
	e->table = table;
	e->size = size;
	memcpy(e->bytes, PyBytes_AS_STRING(table), size);
	return line;
}

/* The event logic both writers share, on this side's primitives. */
#define GIL_INLINE static inline __attribute__((always_inline))
#define GIL_SEQ_BUMP(s) seq_bump(s)
#define GIL_HOLD_PAGE(slots, i) hold_page(slots, i)
#define GIL_LOG2(x) (63 - __builtin_clzll(x))
#define GIL_PUBLISH(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define GIL_ATOMIC_ADD(p, v) __atomic_fetch_add((p), (v), __ATOMIC_SEQ_CST)
#define GIL_FREE_SLOT(s) __atomic_store_n(owner_word(s), 0, __ATOMIC_RELEASE)
#define GIL_READ(dst, n, src) read_memory((dst), (n), (src))
#define GIL_WHERE int /* unused here */
#define GIL_LINE(py, code, addr, depth, where) line_of((PyCodeObject *)(uintptr_t)(code), (int)(addr))
#include "gil_location.h"

/* Where the releasing thread's code is, as hold `hold`'s location (under gil->mutex), where the
 * hold kept a thread waiting. */
static void locate(struct gil_header *h, uint64_t hold, uint64_t tstate)
{
	if (waiting.epoch != epoch || __atomic_load_n(&waiting.threads, __ATOMIC_RELAXED) <= 0)
		return;
	struct gil_location *loc =
		(struct gil_location *)(ring + (1 + nslots + GIL_HOLD_PAGES + (hold & (GIL_LOC_LEN - 1))) * sizeof(struct gil_slot));
	gil_locate(h, loc, hold, tstate, 0);
}

#define GIL_LOCATE(slots, h, n, tstate, where) locate((h), (n), (tstate))
#include "gil_writer.h"


/* The calling thread's slot, claiming and zeroing a free one on its first
 * event (open addressing from tid, as the BPF side and Ring.find do). */
static struct gil_slot *claim(pid_t tid)
{
	for (uint32_t i = 0; i < GIL_PROBE_LEN; i++) {
		struct gil_slot *s = slot_at(((uint32_t)tid + i) % nslots);
		if (__atomic_load_n(&s->tid, __ATOMIC_RELAXED) == (uint32_t)tid)
			return s;
	}
	for (uint32_t i = 0; i < GIL_PROBE_LEN; i++) {
		struct gil_slot *s = slot_at(((uint32_t)tid + i) % nslots);
		uint64_t free_word = 0;
		if (__atomic_load_n(&s->tid, __ATOMIC_RELAXED) == 0 &&
		    __atomic_compare_exchange_n(owner_word(s), &free_word, (uint64_t)(uint32_t)tid, 0, __ATOMIC_ACQ_REL,
						__ATOMIC_RELAXED)) {
			gil_slot_reset(s);
			return s;
		}
	}
	__atomic_fetch_add(&header()->slot_overflows, 1, __ATOMIC_RELAXED);
	return NULL;
}

/* The calling thread's slot (NULL if none is free). A new epoch (install, fork)
 * re-reads the tid and drops open intervals left from before it: a thread that
 * waited across an uninstall would otherwise count that wait forever. */
static inline struct gil_slot *my_slot(void)
{
	if (__builtin_expect(me.epoch == epoch && me.slot != NULL, 1))
		return me.slot;
	if (me.epoch != epoch) {
		me.epoch = epoch;
		me.tid = (pid_t)syscall(SYS_gettid);
		me.slot = NULL;
		me.waiting = 0;
	}
	me.slot = claim(me.tid);
	if (me.slot != NULL) {
		struct gil_slot *s = me.slot;
		if (s->wait_start_ns || s->acquired_ns || s->park_start_ns) {
			seq_bump(s);
			s->wait_start_ns = s->acquired_ns = s->park_start_ns = 0;
			s->flags = 0;
			seq_bump(s);
		}
		pthread_setspecific(exit_key, s);
	}
	return me.slot;
}

/* A thread exits (pthread key destructor): free its slot, then fold its figures
 * into the header, in the BPF side's order (Totals in metrics.py relies on it).
 * Its slot from before an install is still its own (claim() finds it by tid); one
 * from before a fork has another tid (the child's) or was wiped: not this thread's. */
static void on_thread_exit(void *value)
{
	struct gil_slot *s = value;
	pid_t tid = me.epoch == epoch ? me.tid : (pid_t)syscall(SYS_gettid);
	if (s == NULL || ring == NULL || s->tid != (uint32_t)tid)
		return;
	me.slot = NULL;
	if (me.epoch == epoch)
		note_no_wait();
	gil_on_exit(header(), s);
}

/* At uninstall: close every slot's open wait and hold now, into its totals. The hooks
 * see no hand-off from here on, and the next install drops what is still open (a
 * thread's first event of a new epoch): a reader that saw it open would see the
 * counters go down. Run with `active` cleared and under gil->mutex, which a waiter
 * holds while its hook opens a wait, and by the GIL's holder: no owner writes its slot
 * meanwhile (the one exception to "only the owner writes its slot"). */
static void close_open_intervals(void)
{
	pthread_mutex_t *mutex = (pthread_mutex_t *)((char *)gil_cond + sizeof(pthread_cond_t)); /* gil->mutex */
	pthread_mutex_lock(mutex);
	uint64_t now = clock_ns(CLOCK_MONOTONIC);
	for (uint32_t i = 0; i < nslots; i++) {
		struct gil_slot *s = slot_at(i);
		if (!s->wait_start_ns && !s->acquired_ns)
			continue;
		seq_bump(s);
		if (s->wait_start_ns && now > s->wait_start_ns)
			s->wait_ns += now - s->wait_start_ns;
		if (s->acquired_ns && now > s->acquired_ns)
			s->hold_ns += now - s->acquired_ns;
		s->wait_start_ns = s->acquired_ns = 0;
		s->flags = 0;
		seq_bump(s);
	}
	pthread_mutex_unlock(mutex);
}

/* ------------------------------------------------------------ wrappers */

static void learn(pthread_cond_t *cond)
{
	if (learner == (pid_t)syscall(SYS_gettid) && nlearned < 2)
		learned[nlearned++] = cond;
}

static int hook_cond_signal(pthread_cond_t *cond)
{
	struct gil_slot *s;
	if (cond == gil_cond) {
		if (active && (s = my_slot()) != NULL) {
			gil_on_release(ring, header(), s, (__u32)me.tid, clock_ns(CLOCK_MONOTONIC), 0);
			note_wait(s); /* (forced: its own wait opens) */
		}
	} else if (cond == switch_cond) {
		if (active && (s = my_slot()) != NULL) {
			gil_on_acquire(header(), s, (__u32)me.tid, clock_ns(CLOCK_MONOTONIC));
			note_no_wait();
		}
	} else if (__builtin_expect(learner != 0, 0)) {
		learn(cond);
	}
	return real_signal(cond);
}

static int hook_cond_timedwait(pthread_cond_t *cond, pthread_mutex_t *mutex, const struct timespec *abstime)
{
	struct gil_slot *s;
	if (cond == gil_cond && active && (s = my_slot()) != NULL) {
		gil_on_wait(header(), s, clock_ns(CLOCK_MONOTONIC));
		note_wait(s);
	}
	return real_timedwait(cond, mutex, abstime);
}

/* ------------------------------------------------------------ parks */
#ifdef Py_GIL_DISABLED
#include "park_kind.h"

typedef int (*sem_wait_fn)(sem_t *);
typedef int (*sem_timedwait_fn)(sem_t *, const struct timespec *);
typedef int (*sem_clockwait_fn)(sem_t *, clockid_t, const struct timespec *);
static sem_wait_fn real_sem_wait;
static sem_timedwait_fn real_sem_timedwait;
static sem_clockwait_fn real_sem_clockwait;

/* What install_parks was told (park_kind.h: where; the rest for park_begin). */
static struct {
	struct park_where where;
	long entry_addr;    /* &wait_entry.addr - &wait_entry.sema (the sem_t a park sleeps on) */
	uintptr_t park_fn[2], lock_fn[2]; /* _PySemaphore_Wait, PyThread_acquire_lock_timed: [start, end) */
	const int *gil_enabled;         /* the main interpreter's _gil_runtime_state.enabled */
} pl;
static volatile int parks_active;

/* PARK, if this sem_* call is a park made without a GIL: the caller's slot (NULL: not one).
 * A parking-lot park sleeps on its wait_entry's semaphore, on the parking thread's stack
 * right after the address it parks on; PyThread_acquire_lock_timed sleeps on a PyThread
 * lock itself (threading.RLock's on 3.13). Other callers are not parks. */
static struct gil_slot *park_begin(sem_t *sem, uintptr_t caller)
{
	struct gil_slot *s;
	int parked = in(caller, pl.park_fn[0], pl.park_fn[1] - pl.park_fn[0]);
	if (!parks_active || (pl.gil_enabled != NULL && __atomic_load_n(pl.gil_enabled, __ATOMIC_RELAXED)))
		return NULL;
	if (!parked && !in(caller, pl.lock_fn[0], pl.lock_fn[1] - pl.lock_fn[0]))
		return NULL;
	if ((s = my_slot()) == NULL)
		return NULL;
	int saved = errno;
	char name[GIL_PARK_TYPE] = {0};
	uintptr_t addr = parked ? *(const uintptr_t *)((const char *)sem + pl.entry_addr) : (uintptr_t)sem;
	gil_on_park(s, clock_ns(CLOCK_MONOTONIC), parked ? park_kind(&pl.where, addr, name) : GIL_PARK_APP_LOCK, addr, name);
	errno = saved;
	return s;
}

static inline void park_end(struct gil_slot *s)
{
	if (s != NULL)
		gil_on_unpark(header(), s, clock_ns(CLOCK_MONOTONIC));
}

#define CALLER() ((uintptr_t)__builtin_return_address(0))

static int hook_sem_wait(sem_t *sem)
{
	struct gil_slot *s = park_begin(sem, CALLER());
	int result = real_sem_wait(sem), saved = errno;
	park_end(s);
	errno = saved;
	return result;
}

static int hook_sem_timedwait(sem_t *sem, const struct timespec *abstime)
{
	struct gil_slot *s = park_begin(sem, CALLER());
	int result = real_sem_timedwait(sem, abstime), saved = errno;
	park_end(s);
	errno = saved;
	return result;
}

static int hook_sem_clockwait(sem_t *sem, clockid_t clock, const struct timespec *abstime)
{
	struct gil_slot *s = park_begin(sem, CALLER());
	int result = real_sem_clockwait(sem, clock, abstime), saved = errno;
	park_end(s);
	errno = saved;
	return result;
}
#endif /* Py_GIL_DISABLED */

/* ------------------------------------------------------------- fork */

#ifdef Py_GIL_DISABLED
/* The GIL's part for the calls from Python where there may be none: one at a time. A
 * caller waiting here lets its thread state go, as a GIL waiter does (so install()'s
 * release of a GIL turned on at run time cannot deadlock with it). */
static PyMutex api_lock;
#define API_LOCK() PyMutex_Lock(&api_lock)
#define API_UNLOCK() PyMutex_Unlock(&api_lock)
#define API_RESET() memset(&api_lock, 0, sizeof(api_lock))
#else
#define API_LOCK() ((void)0)
#define API_UNLOCK() ((void)0)
#define API_RESET() ((void)0)
#endif

static void after_fork_child(void)
{
	forks++;
	/* A fork in learn_conds' window (it lets its thread state go, holding api_lock): the
	 * child has no thread to release it. */
	API_RESET();
	learner = 0;
#ifdef Py_GIL_DISABLED
	pl.where.pid = getpid();
#endif
	if (ring == NULL)
		return;
	/* The child runs one thread, with the parent's hooks and conds (same
	 * addresses) and a copy of its ring: start the ring afresh for this pid. */
	memset(ring + sizeof(struct gil_slot), 0, ring_size - sizeof(struct gil_slot));
	struct gil_header *h = header();
	h->pid = (uint32_t)getpid();
	h->last_release_tid = h->holder_tid = 0;
	h->slot_overflows = h->exited_threads = h->exits_started = 0;
	h->exited_wait_ns = h->exited_hold_ns = h->exited_acquisitions = h->exited_convoy_waits = 0;
	h->held_total_ns = h->holds_written = h->acquisitions_total = h->last_acquired_ns = h->drop_request = 0;
	h->locations_written = 0;
	memset(h->location_misses, 0, sizeof(h->location_misses));
	memset(h->exited_parked_ns, 0, sizeof(h->exited_parked_ns));
	epoch++;
}

/* ------------------------------------------------------------ Python */

static PyObject *Unsupported;

/* fn(module, arg) under api_lock. */
static PyObject *locked(PyObject *(*fn)(PyObject *, PyObject *), PyObject *module, PyObject *arg)
{
	API_LOCK();
	PyObject *result = fn(module, arg);
	API_UNLOCK();
	return result;
}

static int allocate(uint32_t slots)
{
	size_t size = (size_t)(slots + 1 + GIL_HOLD_PAGES + GIL_LOC_LEN) * sizeof(struct gil_slot); /* header, slots, hold log, locations */
	void *memory = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (memory == MAP_FAILED) {
		PyErr_SetFromErrno(PyExc_OSError);
		return -1;
	}
	ring = memory, ring_size = size, nslots = slots;
	struct gil_header *h = header();
	h->magic = GIL_MAGIC;
	h->layout_version = GIL_LAYOUT_VERSION;
	h->slot_size = sizeof(struct gil_slot);
	h->nslots = slots;
	h->clock_id = CLOCK_MONOTONIC;
	h->pid = (uint32_t)getpid();
	h->cond_stride = COND_STRIDE;
	h->hold_record_ns = GIL_HOLD_RECORD_NS;
	return 0;
}

/* The symbols hooked: the GIL's hand-offs (the comment at the top of this file). */
static struct got interpreter_got;
static const struct got_hook hooked[] = {
	{"pthread_cond_signal", (void *)hook_cond_signal, (void **)&real_signal},
	{"pthread_cond_timedwait", (void *)hook_cond_timedwait, (void **)&real_timedwait},
};

/* Swap the GOT entries; 0, or -1 with Unsupported set (nothing changed). */
static int patch(void)
{
	switch (got_patch(&interpreter_got, hooked, sizeof(hooked) / sizeof(hooked[0]), (const void *)&PyEval_SaveThread)) {
	case 0:
		return 0;
	case GOT_ERRNO:
		PyErr_SetFromErrno(PyExc_OSError);
		return -1;
	default:
		PyErr_Format(Unsupported, "the interpreter: %s; use the collector", interpreter_got.error);
		return -1;
	}
}

/* Learn gil->cond and gil->switch_cond from this thread's own release and
 * re-acquisition of the GIL; 0, or -1 with Unsupported set. */
static int learn_conds(void)
{
	nlearned = 0;
	learner = (pid_t)syscall(SYS_gettid);
	Py_BEGIN_ALLOW_THREADS
	Py_END_ALLOW_THREADS
	learner = 0;
	if (nlearned < 2 || (char *)learned[1] - (char *)learned[0] != (ptrdiff_t)COND_STRIDE) {
		PyErr_Format(Unsupported, "the GIL's condition variables were not recognised in %s (%d signal(s) seen, "
			     "stride %zd, expected %zu)", interpreter_got.object, nlearned,
			     nlearned == 2 ? (char *)learned[1] - (char *)learned[0] : (ptrdiff_t)0, COND_STRIDE);
		return -1;
	}
	switch_cond = learned[1];
	gil_cond = learned[0];
	header()->switch_cond = (uint64_t)(uintptr_t)switch_cond;
	header()->gil_cond = (uint64_t)(uintptr_t)gil_cond;
	return 0;
}

static PyObject *install_locked(PyObject *module, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = {"nslots", "long_wait_ns", "convoy_ns", NULL};
	unsigned int slots;
	unsigned long long long_wait_ns, convoy_ns;
	(void)module;
	if (!PyArg_ParseTupleAndKeywords(args, kwds, "IKK", kwlist, &slots, &long_wait_ns, &convoy_ns))
		return NULL;
	if (active)
		return Py_BuildValue("(kn)", (unsigned long)(uintptr_t)ring, (Py_ssize_t)ring_size);
	if (ring == NULL && (slots < 16 || slots > 65536)) {
		PyErr_SetString(PyExc_ValueError, "nslots must be in 16..65536");
		return NULL;
	}
	if (ring == NULL && allocate(slots) != 0)
		return NULL;
	struct gil_header *h = header();
	h->long_wait_ns = h->long_hold_ns = long_wait_ns;
	h->convoy_ns = convoy_ns;
	if (patch() != 0)
		return NULL;
	if (gil_cond == NULL && learn_conds() != 0) {
		got_restore(&interpreter_got);
		return NULL;
	}
	epoch++;
	active = 1;
	struct gil_slot *mine = my_slot(); /* this thread holds the GIL from now on */
	if (mine != NULL) {
		seq_bump(mine);
		mine->acquired_ns = clock_ns(CLOCK_MONOTONIC);
		mine->tstate = gil_acquired_for(header());
		seq_bump(mine);
		header()->holder_tid = (__u32)me.tid;
		header()->last_acquired_ns = mine->acquired_ns;
	}
	return Py_BuildValue("(kn)", (unsigned long)(uintptr_t)ring, (Py_ssize_t)ring_size);
}

typedef PyObject *(*kw_fn)(PyObject *, PyObject *, PyObject *);

/* fn(module, args, kwds) under api_lock. */
static PyObject *locked_kw(kw_fn fn, PyObject *module, PyObject *args, PyObject *kwds)
{
	API_LOCK();
	PyObject *result = fn(module, args, kwds);
	API_UNLOCK();
	return result;
}

static PyObject *install(PyObject *module, PyObject *args, PyObject *kwds)
{
	return locked_kw(install_locked, module, args, kwds);
}

#ifdef Py_GIL_DISABLED
/* The sem_* calls hooked, one GOT each: libpython may call only some of them. */
static struct got park_gots[3];
static const struct got_hook park_hooks[3] = {
	{"sem_wait", (void *)hook_sem_wait, (void **)&real_sem_wait},
	{"sem_timedwait", (void *)hook_sem_timedwait, (void **)&real_sem_timedwait},
	{"sem_clockwait", (void *)hook_sem_clockwait, (void **)&real_sem_clockwait},
};

/* [start, end) of the function `name` (its dynamic symbol's size); 0 if unknown. */
static int function_range(const char *name, uintptr_t range[2])
{
	void *fn = dlsym(RTLD_DEFAULT, name);
	Dl_info info;
	const ElfW(Sym) *sym = NULL;
	if (fn == NULL || !dladdr1(fn, &info, (void **)&sym, RTLD_DL_SYMENT) || sym == NULL || !sym->st_size)
		return 0;
	range[0] = (uintptr_t)fn;
	range[1] = (uintptr_t)fn + sym->st_size;
	return 1;
}

static PyObject *install_parks_locked(PyObject *module, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = {"nslots", "long_wait_ns", "convoy_ns", "entry_addr", "tstate_state", "ob_mutex",
				 "ob_type", "lock_mutex", "tp_name", "stw_runtime", "stw_interp", "runtime_size",
				 "interp_size", "lock_types", "gil_enabled", NULL};
	unsigned int slots;
	unsigned long long long_wait_ns, convoy_ns, lock_type, rlock_type, gil_enabled;
	(void)module;
	if (!PyArg_ParseTupleAndKeywords(args, kwds, "IKKllllllllkk(KK)K", kwlist, &slots, &long_wait_ns, &convoy_ns,
					 &pl.entry_addr, &pl.where.tstate_state, &pl.where.ob_mutex, &pl.where.ob_type,
					 &pl.where.lock_mutex, &pl.where.tp_name, &pl.where.stw_runtime, &pl.where.stw_interp,
					 &pl.where.runtime_size, &pl.where.interp_size,
					 &lock_type, &rlock_type, &gil_enabled))
		return NULL;
	if (ring == NULL && (slots < 16 || slots > 65536)) {
		PyErr_SetString(PyExc_ValueError, "nslots must be in 16..65536");
		return NULL;
	}
	if (!function_range("_PySemaphore_Wait", pl.park_fn)) {
		PyErr_Format(Unsupported, "_PySemaphore_Wait is not among the interpreter's dynamic symbols");
		return NULL;
	}
	function_range("PyThread_acquire_lock_timed", pl.lock_fn);
	if (ring == NULL && allocate(slots) != 0)
		return NULL;
	if (!parks_active) {
		header()->long_wait_ns = header()->long_hold_ns = long_wait_ns;
		header()->convoy_ns = convoy_ns;
	}
	pl.where.runtime = (uintptr_t)dlsym(RTLD_DEFAULT, "_PyRuntime");
	pl.where.interp = (uintptr_t)PyInterpreterState_Main();
	pl.where.lock_types[0] = (uintptr_t)lock_type, pl.where.lock_types[1] = (uintptr_t)rlock_type;
	pl.gil_enabled = (const int *)(uintptr_t)gil_enabled;
	pl.where.pid = getpid();
	int patched = 0;
	for (int i = 0; i < 3; i++) {
		int failed = got_patch(&park_gots[i], &park_hooks[i], 1, (const void *)&PyEval_SaveThread);
		if (failed == GOT_ERRNO) {
			for (int j = 0; j < i; j++)
				got_restore(&park_gots[j]);
			return PyErr_SetFromErrno(PyExc_OSError);
		}
		patched += !failed;
	}
	if (!patched) {
		PyErr_Format(Unsupported, "the interpreter: %s; use the collector", park_gots[0].error);
		return NULL;
	}
	epoch++;
	parks_active = 1;
	return Py_BuildValue("(kn)", (unsigned long)(uintptr_t)ring, (Py_ssize_t)ring_size);
}

static PyObject *install_parks(PyObject *module, PyObject *args, PyObject *kwds)
{
	return locked_kw(install_parks_locked, module, args, kwds);
}

/* Stop timing parks (a park under way when the entries are restored is closed by its own hook). */
static PyObject *uninstall_parks(PyObject *module, PyObject *unused)
{
	(void)module, (void)unused;
	API_LOCK();
	__atomic_store_n(&parks_active, 0, __ATOMIC_SEQ_CST);
	for (int i = 0; i < 3; i++)
		got_restore(&park_gots[i]);
	API_UNLOCK();
	Py_RETURN_NONE;
}
#endif /* Py_GIL_DISABLED */

static PyObject *uninstall(PyObject *module, PyObject *unused)
{
	(void)module, (void)unused;
	API_LOCK();
	__atomic_store_n(&active, 0, __ATOMIC_SEQ_CST);
	if (ring != NULL && gil_cond != NULL)
		close_open_intervals();
	got_restore(&interpreter_got);
	API_UNLOCK();
	Py_RETURN_NONE;
}

/* A struct gil_py_layout from Python's bytes, with this process's type objects. */
static int layout_from(PyObject *arg, struct gil_py_layout *layout)
{
	Py_buffer view;
	if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) != 0)
		return -1;
	int ok = view.len == (Py_ssize_t)sizeof(*layout);
	if (ok) {
		memcpy(layout, view.buf, sizeof(*layout));
		layout->code_type = (uint64_t)(uintptr_t)&PyCode_Type;
		layout->str_type = (uint64_t)(uintptr_t)&PyUnicode_Type;
		layout->bytes_type = (uint64_t)(uintptr_t)&PyBytes_Type;
	}
	PyBuffer_Release(&view);
	if (!ok)
		PyErr_Format(PyExc_ValueError, "a gil_py_layout is %zu bytes", sizeof(*layout));
	return ok ? 0 : -1;
}

static PyObject *locate_self_locked(PyObject *module, PyObject *arg)
{
	(void)module;
	struct gil_header h;
	struct gil_location loc;
	int fds[2];
	if (gil_cond == NULL) {
		PyErr_SetString(PyExc_RuntimeError, "install() first: the GIL's condition variables are not known");
		return NULL;
	}
	memcpy(&h, header(), sizeof(h));
	if (layout_from(arg, &h.py) != 0)
		return NULL;
	if (pipe2(fds, O_CLOEXEC) != 0)
		return PyErr_SetFromErrno(PyExc_OSError);
	memset(&loc, 0, sizeof(loc));
	checking = fds[1], check_reads = fds[0];
	gil_locate(&h, &loc, 0, gil_acquired_for(&h), 0); /* with the GIL held: last_holder is ours */
	checking = -1;
	close(fds[0]);
	close(fds[1]);
	return PyBytes_FromStringAndSize((const char *)&loc, sizeof(loc));
}

static PyObject *locate_self(PyObject *module, PyObject *arg) { return locked(locate_self_locked, module, arg); }

static PyObject *set_layout_locked(PyObject *module, PyObject *arg)
{
	(void)module;
	struct gil_py_layout layout;
	if (ring == NULL) {
		PyErr_SetString(PyExc_RuntimeError, "install() first: no ring");
		return NULL;
	}
	if (layout_from(arg, &layout) != 0)
		return NULL;
	header()->py = layout; /* with the GIL held: no release runs gil_locate meanwhile */
	struct gil_slot *mine = active ? my_slot() : NULL;
	if (mine != NULL) { /* the other threads' slots learn their state at their next acquisition */
		seq_bump(mine);
		mine->tstate = gil_acquired_for(header());
		seq_bump(mine);
	}
	Py_RETURN_NONE;
}

static PyObject *set_layout(PyObject *module, PyObject *arg) { return locked(set_layout_locked, module, arg); }

/* Append a row per entry of `got` to `list` (NULL stays NULL; a failure clears it). */
static PyObject *append_entries(PyObject *list, const struct got *got)
{
	const struct got_entry *e = got->entries;
	for (int i = 0; list != NULL && i < got->n; i++) {
		PyObject *row = Py_BuildValue("{s:s,s:k,s:k,s:k,s:O}", "symbol", e[i].hooked->symbol, "address",
					      (unsigned long)(uintptr_t)e[i].address, "value",
					      (unsigned long)(uintptr_t)*e[i].address, "original",
					      (unsigned long)(uintptr_t)e[i].original, "relro", e[i].relro ? Py_True : Py_False);
		if (row == NULL || PyList_Append(list, row) != 0)
			Py_CLEAR(list);
		Py_XDECREF(row);
	}
	return list;
}

static PyObject *hooked_entries(PyObject *module, PyObject *unused)
{
	(void)module, (void)unused;
	API_LOCK();
	PyObject *list = append_entries(PyList_New(0), &interpreter_got);
#ifdef Py_GIL_DISABLED
	for (int i = 0; i < 3; i++)
		list = append_entries(list, &park_gots[i]);
#endif
	API_UNLOCK();
	return list;
}

static PyObject *fork_count(PyObject *module, PyObject *unused)
{
	(void)module, (void)unused;
	return PyLong_FromUnsignedLong(forks);
}

static PyObject *object(PyObject *module, PyObject *unused)
{
	(void)module, (void)unused;
	return PyUnicode_DecodeFSDefault(interpreter_got.object);
}

static PyMethodDef methods[] = {
	{"install", (PyCFunction)(void (*)(void))install, METH_VARARGS | METH_KEYWORDS,
	 "install(nslots, long_wait_ns, convoy_ns) -> (address, size): hook the GIL's hand-offs (GIL held)."},
	{"uninstall", uninstall, METH_NOARGS, "Restore the original GOT entries; the ring stays mapped."},
#ifdef Py_GIL_DISABLED
	{"install_parks", (PyCFunction)(void (*)(void))install_parks, METH_VARARGS | METH_KEYWORDS,
	 "install_parks(nslots, long_wait_ns, convoy_ns, **offsets) -> (address, size): time each park made "
	 "without a GIL (the sem_* GOT entries), by what it parked on (otel_gil/parks.py passes the offsets)."},
	{"uninstall_parks", uninstall_parks, METH_NOARGS, "Restore the sem_* GOT entries; the ring stays mapped."},
#endif
	{"locate_self", locate_self, METH_O,
	 "locate_self(layout) -> bytes: the calling thread's struct gil_location read through a struct gil_py_layout "
	 "(bytes), with reads that fail instead of faulting; the ring is not touched."},
	{"set_layout", set_layout, METH_O,
	 "set_layout(layout): logged holds record their location through this struct gil_py_layout (bytes)."},
	{"got_entries", hooked_entries, METH_NOARGS, "The GOT entries hooked: symbol, address, value, original, relro."},
	{"forks", fork_count, METH_NOARGS, "How many fork()s, by any caller, this process came out of."},
	{"object", object, METH_NOARGS, "The ELF object whose GOT is hooked."},
	{NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
	PyModuleDef_HEAD_INIT,
	.m_name = "otel_gil._inprocess",
	.m_doc = "The in-process writer of the GIL slot layout (GOT hooks on the GIL's condition variables).",
	.m_size = -1,
	.m_methods = methods,
};

PyMODINIT_FUNC PyInit__inprocess(void)
{
	PyObject *m = PyModule_Create(&module_def);
	if (m == NULL)
		return NULL;
	if (pthread_key_create(&exit_key, on_thread_exit) != 0 || pthread_atfork(NULL, NULL, after_fork_child) != 0) {
		Py_DECREF(m);
		return PyErr_SetFromErrno(PyExc_OSError);
	}
	Unsupported = PyErr_NewExceptionWithDoc("otel_gil._inprocess.Unsupported",
						"This interpreter cannot be traced in-process; the message says why.",
						NULL, NULL);
	if (Unsupported == NULL || PyModule_AddObject(m, "Unsupported", Unsupported) ||
	    PyModule_AddIntConstant(m, "SLOT_SIZE", sizeof(struct gil_slot)) ||
	    PyModule_AddIntConstant(m, "LAYOUT_VERSION", GIL_LAYOUT_VERSION) ||
	    DECLARE_MODULE_GIL(m, Py_MOD_GIL_NOT_USED)) {
		Py_DECREF(m);
		return NULL;
	}
	Py_INCREF(Unsupported);
	return m;
}

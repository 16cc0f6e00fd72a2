/* What otel_gil._fastspan's C files share: the span hooks (_fastspan.c, their figures in
 * span_figures.h), the switch hooks that charge each context its own GIL time
 * (context_switches.c), the thread's name (thread_names.c), the wait ratio histogram
 * (wait_ratios.c).
 *
 * The slot layout is gil_layout.h (beside this file), the one the writers fill.
 */
#ifndef OTEL_GIL_FASTSPAN_H
#define OTEL_GIL_FASTSPAN_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <linux/types.h> /* the __u32/__u64 of gil_layout.h */
#include <stdint.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifdef Py_GIL_DISABLED
#error "otel_gil._fastspan needs the GIL: setup.py builds it only where there is one (free-threaded builds use the Python hooks)"
#endif

#include "clock_ns.h"
#include "gil_layout.h"
#include "py_versions.h"

#define HIDDEN __attribute__((visibility("hidden")))
/* A path the common case never takes: out of line, apart from the hot code. */
#define COLD __attribute__((noinline, cold))

/* PyLong_AsLong for span ids and times: quicker than the ...LongLong calls, as wide on LP64. */
_Static_assert(sizeof(long) == 8, "otel_gil._fastspan needs a 64-bit long (LP64)");

/* A thread's figures, open wait and hold closed at some instant. */
struct counters {
	uint64_t wait_ns, hold_ns, acquisitions, convoy_waits, long_waits;
};

/* What a span's own code did on the GIL, charged at each switch of context on every
 * thread it ran on (context_switches.c): on its home thread (where it started), and
 * on others (worker threads running its context). A child span's charges are its
 * ancestors' too. */
#define OWN_TIDS 8         /* other threads told apart; past that, threads_else is OWN_MANY */
#define OWN_MANY UINT32_MAX
#define OWN_UNSEEN 1       /* ran on a thread whose context switches were not all seen */
#define OWN_BROKEN 2       /* a thread's counters went back between two charges: a charge is missing */
struct own {
	uint64_t hold_home, acquisitions_home;
	uint64_t wait_else, hold_else, acquisitions_else, convoy_else;
	uint32_t tids_else[OWN_TIDS];
	uint32_t threads_else;
	uint32_t flags;
};

/* What a span needs at its end; the Python hooks read the same fields from it. Also the
 * span's accumulator of its own GIL time, linked to its parent's. */
typedef struct Start {
	PyObject_HEAD
	PyObject *registration;
	PyObject *ring;    /* the otel_gil.ring.Ring: holding it keeps the mapping alive */
	PyObject *metrics; /* GilMetrics or None */
	PyObject *status;
	const char *base;  /* the mapping */
	uint32_t nslots;
	uint64_t long_wait_ns;
	long generation;
	long tid;
	long long mono_ns, wall_ns;
	struct counters counters; /* the home thread's, at the start */
	/* Context mode (context_switches.c): set when the switch hooks track this span. */
	int tracked;
	int switched;              /* the home thread switched contexts while the span ran */
	uint64_t switches;         /* the home thread's switch count at the start */
	uint64_t span_id;
	uint64_t epoch;            /* context_switches.c's tracking epoch at the start */
	uint32_t home_tid;
	PyObject *name;            /* the span's name, for blame on shared threads */
	struct Start *parent;      /* the local parent span's (a new reference), NULL at a root */
	struct Start *prev_running; /* what ran on the home thread before this span started, until it ends */
	struct own own;
} Start;

extern HIDDEN PyTypeObject StartType;

/* The span hooks' state; context_switches.c reads the ring they track. */
typedef struct RatioCounter RatioCounter;
typedef struct {
	PyObject_HEAD
	PyObject *registration;
	PyObject *metrics;
	PyObject *ok;          /* the status string of a registered process */
	PyObject *py_on_start; /* spans.GilSpanProcessor's Python path: (span) -> None */
	PyObject *py_end;      /* spans.end_wrapper: (bound Span.end, span, args, kwargs), as wrapt calls it */
	PyObject *py_server;   /* spans.record_server_span: (start, span, wait_ratio) -> None */
	PyObject *server_kind; /* SpanKind.SERVER: only server spans feed the metrics */
	RatioCounter *ratios;  /* the metrics' counter, where it is this module's; else NULL: py_server counts */
	PyObject *threading;
	PyObject *state;       /* the registration's state (client.State) last seen registered, with that ring */
	PyObject *ring;        /* the ring the cached fields below describe */
	const char *base;
	uint32_t nslots;
	uint64_t long_wait_ns;
	long generation;       /* the registration's, when the ring was last looked up */
	unsigned long seen_forks; /* forks when the backend last checked its pid */
	int enabled;
	int every;             /* OTEL_GIL_ALL_ATTRIBUTES: every figure on every span (spans.carried) */
} Hooks;

extern HIDDEN PyTypeObject HooksType;

/* fork()s this process came out of (any caller: C code's too). */
extern HIDDEN unsigned long forks;

/* The calling thread's kernel tid and slot, valid for one registration generation. */
struct thread_slot {
	PyObject *registration; /* compared, never dereferenced */
	long generation;
	unsigned long forks;
	pid_t tid;
	long index;
};
extern HIDDEN __thread __attribute__((tls_model("initial-exec"))) struct thread_slot tls;

/* Interned by _fastspan.c: "_otel_gil_start" (where a span keeps its Start), and what
 * thread_names.c looks up: threading._active, Thread._name and .name, and its cache's key. */
extern HIDDEN PyObject *s_start_attr, *s_active, *s_private_name, *s_public_name, *s_thread_key;

static inline void thread_for(PyObject *registration, long generation)
{
	if (tls.registration != registration || tls.generation != generation || tls.forks != forks) {
		tls.registration = registration;
		tls.generation = generation;
		tls.forks = forks;
		tls.tid = (pid_t)syscall(SYS_gettid);
		tls.index = -1;
	}
}

static inline const volatile struct gil_slot *slot_at(const char *base, long index)
{
	return (const volatile struct gil_slot *)(base + (index + 1) * sizeof(struct gil_slot));
}

/* The slot of the calling thread (tls.tid), -1 if it has none yet; ring.Ring.find in C. */
static inline long find_slot(const char *base, uint32_t nslots)
{
	uint32_t tid = (uint32_t)tls.tid;
	if (tls.index >= 0 && tls.index < (long)nslots && slot_at(base, tls.index)->tid == tid)
		return tls.index;
	for (uint32_t i = 0; i < GIL_PROBE_LEN; i++) {
		long index = (long)((tid + i) % nslots);
		if (slot_at(base, index)->tid == tid)
			return tls.index = index;
	}
	return -1;
}

/* A slot's counters at `now`, open intervals closed there: ring.counters in C, and the
 * only place the C side closes them (an open wait still GIL_SLOT_UNCHECKED may turn out
 * to be none, and is not counted). */
static inline void slot_counters(const volatile struct gil_slot *s, uint64_t now, struct counters *out)
{
	uint64_t wait_start = s->flags & GIL_SLOT_UNCHECKED ? 0 : s->wait_start_ns, acquired = s->acquired_ns;
	out->wait_ns = s->wait_ns + (wait_start && now > wait_start ? now - wait_start : 0);
	out->hold_ns = s->hold_ns + (acquired && now > acquired ? now - acquired : 0);
	out->acquisitions = s->acquisitions;
	out->convoy_waits = s->convoy_waits;
	out->long_waits = s->long_waits;
}

/* The calling thread's counters at `now` (ring.Ring.read in C). Only the calling thread's
 * own slot: a writer writes it only on this thread's GIL hand-offs, which cannot happen
 * while it runs this with the GIL held. */
static inline void read_counters(const char *base, uint32_t nslots, uint64_t now, struct counters *out)
{
	long index = find_slot(base, nslots);
	if (index < 0) {
		*out = (struct counters){0};
		return;
	}
	slot_counters(slot_at(base, index), now, out);
}

/* PyErr_Clear() where an error is set: the call alone costs what a dict lookup does. */
static inline void clear_error(void)
{
	if (PyErr_Occurred())
		PyErr_Clear();
}

/* PyErr_Occurred() where the caller has its thread state at hand, without looking it up again
 * (from 3.12, a call into libpython's thread-local storage each time). */
static inline int error_in(PyThreadState *ts)
{
#if PY_3_12_OR_LATER
	return ts->current_exception != NULL;
#else
	return ts->curexc_type != NULL;
#endif
}

/* clear_error() in the caller's thread state. */
static inline void clear_error_in(PyThreadState *ts)
{
	if (error_in(ts))
		PyErr_Clear();
}

/* cpython_layouts.c: getattr(obj, name, NULL) without raising (and paying for) an AttributeError,
 * and where CPython allows, without the generic lookup. A new reference. */
HIDDEN PyObject *lookup(PyObject *obj, PyObject *name);
/* Where one call site of lookup last found its name: CPython's own inline cache, in short (the
 * cache's hash and probes skipped while the site reads one type's instances). */
struct site {
	PyTypeObject *type; /* compared, never dereferenced (the version tag tells a reused address) */
	unsigned int version;
	void *keys;
	Py_ssize_t index;
};
/* lookup(obj, name), through the site's record first. */
HIDDEN PyObject *lookup_at(PyObject *obj, PyObject *name, struct site *site);
#define LOOKUP(obj, name) __extension__({ static struct site site_; lookup_at((obj), (name), &site_); })
/* Where one call site of fields_read last found its names: a site's record for several names of
 * one type's instances, checked once for all of them. */
#define FIELDS_MAX 8
struct fields {
	PyTypeObject *type; /* compared, never dereferenced */
	unsigned int version;
	void *keys;
	Py_ssize_t top; /* the largest index */
	Py_ssize_t index[FIELDS_MAX];
};
/* out[i] = lookup(obj, names[i]) for i < n (<= FIELDS_MAX), through the site's record first. */
HIDDEN void fields_read(PyObject *obj, PyObject *const *names, int n, struct fields *site, PyObject **out);
/* fields_read from a call site of its own: FIELDS(span, out, s_a, s_b) reads out[0], out[1]. */
#define FIELDS(obj, out, ...)                                                                     \
	do {                                                                                      \
		static struct fields site_;                                                       \
		PyObject *const names_[] = {__VA_ARGS__};                                         \
		fields_read((obj), names_, (int)(sizeof(names_) / sizeof(names_[0])), &site_, (out)); \
	} while (0)
/* _fastspan.c: whether obj's `_lock` (a threading.Lock) is free, read in place where it can be. */
HIDDEN int lock_free(PyObject *obj);
/* setattr(obj, name, value) (value not NULL): 0, or -1 with an error set; where CPython allows, and a
 * lookup of that name on that type came first, without the generic store. */
HIDDEN int store_attr(PyObject *obj, PyObject *name, PyObject *value);
/* keys[i]: values[i] (str keys) into the empty dict, as inserting them in order would leave it,
 * through model (a dict only this function writes, one per set of keys): 1; 0 where CPython
 * allows no such shortcut (the caller inserts them); -1 with an error set. */
HIDDEN int dict_fill_empty(PyObject *dict, PyObject *model, PyObject *const *keys, PyObject *const *values,
			   Py_ssize_t n);

/* _fastspan.c: v as a float attribute value (a new reference); 0.0 (and -0.0, as 0.0) one float kept for all. */
HIDDEN PyObject *float_value(double v);
/* PyLong_AsLong(v), *ok 1; or *ok 0 where that fails (no error left set). */
HIDDEN long long_value(PyObject *v, int *ok);
/* PyLong_AsUnsignedLong(v), *ok 1; or *ok 0 where that fails (no error left set). */
HIDDEN unsigned long ulong_value(PyObject *v, int *ok);
/* PyLong_FromLong(v), quicker for v >= 2**60 (a time in ns). */
HIDDEN PyObject *long_from(long v);
/* Read lock's state (a lock of lock's type) in place from now on, if its layout proves what this
 * CPython's is (acquired and released here): 1, else 0; -1 with an error set. */
HIDDEN int lock_probe(PyObject *lock);
/* Whether a lock of the probed type is held (1) or not (0), as its locked() says; -1: another type. */
HIDDEN int lock_state(PyObject *lock);

/* tp_descr_get of a method that takes a class's method's place (Py_TPFLAGS_METHOD_DESCRIPTOR):
 * bound to an instance, itself on the class. */
static inline PyObject *bind_method(PyObject *self, PyObject *obj, PyObject *type)
{
	if (obj == NULL || obj == Py_None) {
		Py_INCREF(self);
		return self;
	}
	return PyMethod_New(self, obj);
}

/* wait_ratios.c */
extern HIDDEN PyTypeObject RatioCounterType;
/* One server span's wait ratio into its route's bucket (route: a str); 0, or -1 with an error set. */
HIDDEN int count_ratio(RatioCounter *self, PyObject *route, double ratio);

/* thread_names.c: the calling thread's name and (*ident_out) ident, new references; NULL on an error.
 * ts: the calling thread's state (the span hooks look it up once, clear_error_in). */
HIDDEN PyObject *thread_name(PyObject *threading, PyObject **ident_out, PyThreadState *ts);

/* context_switches.c */
HIDDEN int contexts_init(PyObject *module);
HIDDEN int tracking_contexts(Hooks *hooks);
HIDDEN int tracked_throughout(const Start *start);
HIDDEN void context_start(Hooks *hooks, Start *start, PyObject *span, PyThreadState *ts);
/* The span ends, named `name` now (borrowed, NULL: unknown): the instant charged to (CLOCK_MONOTONIC), 0 where none was. */
HIDDEN uint64_t context_end(Start *start, PyObject *name, PyThreadState *ts);
HIDDEN PyObject *contexts_track(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
HIDDEN PyObject *contexts_untrack(PyObject *module, PyObject *unused);
HIDDEN PyObject *contexts_hook_modules(PyObject *module, PyObject *unused);
HIDDEN PyObject *contexts_held_by(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
/* Whether the thread of kernel id tid logs its context switches (held_by tells of it, not None). */
HIDDEN int contexts_switching(unsigned long tid);
/* A context entered or left where no hook of context_switches.c sees it: a charge point
 * (with the GIL; any exception the caller has set is kept). */
HIDDEN void context_switched(void);

/* module_switches.c: extension modules that enter contexts in C (uvloop), before 3.14. */
/* Hook those loaded now (and not hooked yet, nor failed). */
HIDDEN void module_switches_hook(void);
/* Whether `loop` is the event loop of a hooked module (hooks those loaded first). */
HIDDEN int module_switches_loop(PyObject *loop);
/* Restore every module's entries. */
HIDDEN void module_switches_unhook(void);
/* _fastspan.module_switches(): {module: {hooked, entries, object, error}}. */
HIDDEN PyObject *module_switches_state(PyObject *module, PyObject *unused);

#endif

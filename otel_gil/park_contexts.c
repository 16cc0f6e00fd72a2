/* Parked time follows the context, not the thread, on free-threaded builds without a GIL.
 *
 * The park hooks of _inprocess.c write each thread's parks into its slot (gil_layout.h,
 * parked_ns). On an event loop many requests share one OS thread, so a thread's park
 * deltas over a span's lifetime are everyone's. As context_switches.c does for the GIL
 * figures on default builds, every switch of context on a thread is a charge point: the
 * thread's park counters there, minus those at its previous charge point, belong to the
 * span whose code ran in between (a Parked object, the span's `_otel_gil_parked`) and to
 * its ancestors; its long parks too (copied: the slot's ring moves on). Charge points:
 *   - contextvars.Context.run, replaced in the type: stdlib loops run every task step and
 *     callback through it (Handle._run), and so do to_thread, anyio and asgiref workers;
 *   - greenlet.settrace (per thread, set at its first span);
 *   - a span's start (its code runs from then on) and end (what ran before it runs again).
 * Switches no hook sees (uvloop, other C extensions entering contexts) are caught as
 * context_switches.c catches them: at a span's start or end, a context other than the one
 * last switched to whose span is not the one running, or a running loop that is not a
 * stdlib loop. The thread is then marked for good and the spans its charges reach carry
 * no parked time.
 *
 * No GIL: a thread's Charges (in its thread state's dict, cached in TLS) is touched by that
 * thread only; a Parked may be charged by several threads at once (a worker running its
 * context), under its own PyMutex; module state is written by track() and untrack() under
 * a lock, and read with atomics. Only the calling thread's own slot is read: only it
 * writes there, and not while it runs this (a park is a sleep).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <linux/types.h> /* the __u32/__u64 of gil_layout.h */
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef Py_GIL_DISABLED
#error "otel_gil._parkcontexts is for free-threaded builds (setup.py builds it there only)"
#endif

#include "clock_ns.h"
#include "gil_layout.h"
#include "py_versions.h"

#define OTHER_TIDS 8   /* other threads told apart; past that, threads_else is -1 */
#define SEEN_LEN 16    /* contexts a thread remembers the Parked of (a power of 2) */
#define UNSEEN 1       /* ran where a switch no hook saw changed whose code ran */
#define BROKEN 2       /* a thread's counters went back between two charges */

/* Written by track() and untrack() under api_lock (and in a forked child), read with atomics. */
static PyMutex api_lock;
static const char *ring_base; /* the park ring (_inprocess.install_parks), mapped for the process's life */
static uint32_t ring_slots;
static uint64_t generation = 1; /* bumped at track(), untrack(), in a forked child: what was read is void */
static int tracking;
static PyObject *otel_var, *span_key; /* OpenTelemetry's ContextVar and its span key; kept for good once set */
static PyObject *s_charges_key, *s_parked_attr;

/* ---------------------------------------------------------------- a span's parks */

typedef struct Parked {
	PyObject_HEAD
	PyMutex mutex;               /* the counters below: charged from any thread */
	struct Parked *parent;       /* the local parent span's (a new reference), NULL at a root */
	struct Parked *prev_running; /* what ran on the home thread before the span started, until it ends */
	uint64_t span_id, start_ns, generation;
	uint32_t home_tid, flags;
	uint64_t ns[GIL_PARK_KINDS], parks, home_ns, else_ns;
	uint32_t tids_else[OTHER_TIDS];
	int32_t threads_else;
	uint64_t long_parks; /* charged; ring[long_parks % GIL_PARK_RING_LEN] is next */
	struct gil_long_park ring[GIL_PARK_RING_LEN];
} Parked;

static void Parked_dealloc(Parked *self)
{
	Py_XDECREF(self->parent);
	Py_XDECREF(self->prev_running);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject ParkedType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "otel_gil._parkcontexts.Parked",
	.tp_basicsize = sizeof(Parked),
	.tp_dealloc = (destructor)Parked_dealloc,
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "One span's own parks: charged at each switch of context on every thread its code ran on.",
};

/* A thread's park counters at a charge point. */
struct tally {
	uint64_t ns[GIL_PARK_KINDS], parks, long_parks;
};

static void add(Parked *a, const struct tally *d, const volatile struct gil_slot *s, uint64_t first_long,
		uint32_t tid, int unseen)
{
	uint64_t total = 0;
	PyMutex_Lock(&a->mutex);
	if (unseen)
		a->flags |= UNSEEN;
	for (int k = 0; k < GIL_PARK_KINDS; k++) {
		a->ns[k] += d->ns[k];
		total += d->ns[k];
	}
	a->parks += d->parks;
	for (uint64_t i = first_long; s != NULL && i < d->long_parks; i++)
		memcpy(&a->ring[a->long_parks++ & (GIL_PARK_RING_LEN - 1)],
		       (const void *)&s->park_ring[i & (GIL_PARK_RING_LEN - 1)], sizeof(struct gil_long_park));
	if (tid == a->home_tid) {
		a->home_ns += total;
	} else if (total) {
		a->else_ns += total;
		int known = a->threads_else < 0;
		for (int i = 0; !known && i < a->threads_else; i++)
			known = a->tids_else[i] == tid;
		if (!known)
			a->threads_else = a->threads_else == OTHER_TIDS ? -1 : a->threads_else + 1;
		if (!known && a->threads_else > 0)
			a->tids_else[a->threads_else - 1] = tid;
	}
	PyMutex_Unlock(&a->mutex);
}

/* One span's flag (the rest of its chain: switch_hooks.h's flag_chain). */
static void flag_one(Parked *a, uint32_t flag)
{
	PyMutex_Lock(&a->mutex);
	a->flags |= flag;
	PyMutex_Unlock(&a->mutex);
}

/* ---------------------------------------------------------------- per thread */

/* A context (by its immutable key) and the Parked of its current span. */
struct seen {
	PyObject *key; /* switch_hooks.h's context_key */
	Parked *running;
};

typedef struct {
	PyObject_HEAD
	PyThreadState *tstate; /* the thread state whose dict keeps it (switch_hooks.h) */
	void *owner;          /* &here of its thread */
	uint64_t generation;  /* of `last` and `tid` */
	uint32_t tid;
	long index;           /* its slot, -1: none yet */
	struct tally last;    /* its counters at its last charge point */
	Parked *running;      /* whose code runs now; NULL: no span's */
	PyObject *context;    /* tstate->context as of the last charge point */
	int unseen;           /* a switch no hook saw changed whose code ran here */
	PyObject *loop;       /* the running loop last checked */
	int loop_seen;        /* ... a stdlib loop, whose switches Context.run sees */
	PyObject *tracer;     /* this thread's greenlet tracer, once set */
	PyObject *spare_run;  /* a freed ctx.run bound, for the next (switch_hooks.h) */
	Py_ssize_t modules;   /* len(sys.modules) when greenlet was last looked for */
	int remembered;       /* entries of seen and by_otel with a running (switch_hooks.h) */
	struct seen seen[SEEN_LEN];
	struct seen by_otel[SEEN_LEN]; /* by OpenTelemetry's context: a mapping's misses looked up there */
} Charges;

static __thread __attribute__((tls_model("initial-exec"))) struct {
	PyThreadState *tstate;
	Charges *charges;
} here;

static void Charges_dealloc(Charges *self)
{
	if (self->owner == (void *)&here) {
		here.tstate = NULL;
		here.charges = NULL;
	}
	Py_XDECREF(self->running);
	Py_XDECREF(self->context);
	Py_XDECREF(self->loop);
	Py_XDECREF(self->tracer);
	if (self->spare_run != NULL)
		PyObject_GC_Del(self->spare_run);
	for (int i = 0; i < SEEN_LEN; i++) {
		Py_XDECREF(self->seen[i].key);
		Py_XDECREF(self->seen[i].running);
		Py_XDECREF(self->by_otel[i].key);
		Py_XDECREF(self->by_otel[i].running);
	}
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject ChargesType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "otel_gil._parkcontexts.Charges",
	.tp_basicsize = sizeof(Charges),
	.tp_dealloc = (destructor)Charges_dealloc,
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "One thread's charge point: its park counters then and whose code runs since.",
};

/* The thread's Charges, Context.run's replacement, the greenlet tracer (switch_hooks.h). */
#define SWITCH_HOOKS_MODULE "otel_gil._parkcontexts"
#define SWITCH_TRACKING __atomic_load_n(&tracking, __ATOMIC_ACQUIRE)
#define SWITCH_RUNNING Parked
#define SWITCH_UNSEEN UNSEEN
#define SWITCH_FLAG flag_one
#define SWITCH_OTEL_VAR __atomic_load_n(&otel_var, __ATOMIC_ACQUIRE)
#define SWITCH_SPAN_KEY __atomic_load_n(&span_key, __ATOMIC_ACQUIRE)
#define SWITCH_OF_SPAN parked_of
#define SWITCH_LOOP_SEEN(loop) 0 /* (no GOT hooks of loop modules here) */
static Parked *parked_of(PyObject *span);
#include "switch_hooks.h"

/* The calling thread's own slot (NULL: it has not parked yet), from the tracked ring. */
static const volatile struct gil_slot *own_slot(Charges *tc, const char *base, uint32_t nslots)
{
	const volatile struct gil_slot *s;
	if (tc->index >= 0 && tc->index < (long)nslots) {
		s = (const volatile struct gil_slot *)(base + (tc->index + 1) * sizeof(struct gil_slot));
		if (s->tid == tc->tid)
			return s;
	}
	for (uint32_t i = 0; i < GIL_PROBE_LEN; i++) {
		long index = (long)((tc->tid + i) % nslots);
		s = (const volatile struct gil_slot *)(base + (index + 1) * sizeof(struct gil_slot));
		if (s->tid == tc->tid) {
			tc->index = index;
			return s;
		}
	}
	return NULL;
}

/* The calling thread's counters now (and its slot, NULL if none); 1 if they continue its
 * last charge point's, 2 if charging starts here (a new ring or a fork), 0 if not tracking. */
static int counters_now(Charges *tc, struct tally *c, const volatile struct gil_slot **slot)
{
	if (!__atomic_load_n(&tracking, __ATOMIC_ACQUIRE))
		return 0;
	uint64_t gen = __atomic_load_n(&generation, __ATOMIC_ACQUIRE);
	const char *base = __atomic_load_n(&ring_base, __ATOMIC_ACQUIRE);
	uint32_t nslots = __atomic_load_n(&ring_slots, __ATOMIC_ACQUIRE);
	int step = 1;
	if (tc->generation != gen) {
		tc->generation = gen;
		tc->tid = (uint32_t)syscall(SYS_gettid);
		tc->index = -1;
		tc->unseen = 0;
		Py_CLEAR(tc->loop);
		step = 2;
	}
	const volatile struct gil_slot *s = own_slot(tc, base, nslots);
	*c = (struct tally){0};
	if (s != NULL) {
		for (int k = 0; k < GIL_PARK_KINDS; k++)
			c->ns[k] = s->parked_ns[k];
		c->parks = s->parks;
		c->long_parks = s->long_parks;
	}
	*slot = s;
	if (step == 2)
		tc->last = *c;
	return step;
}

/* Charge the thread's parks since its last charge point to the span running there and its ancestors. */
static void charge(Charges *tc, const struct tally *c, const volatile struct gil_slot *s)
{
	const struct tally *l = &tc->last;
	int back = c->parks < l->parks || c->long_parks < l->long_parks;
	for (int k = 0; k < GIL_PARK_KINDS; k++)
		back |= c->ns[k] < l->ns[k];
	if (back) {
		flag_chain(tc->running, BROKEN);
	} else if (tc->running != NULL && c->parks != l->parks) {
		struct tally d = {.parks = c->parks - l->parks, .long_parks = c->long_parks};
		for (int k = 0; k < GIL_PARK_KINDS; k++)
			d.ns[k] = c->ns[k] - l->ns[k];
		uint64_t first = l->long_parks;
		if (c->long_parks - first > GIL_PARK_RING_LEN)
			first = c->long_parks - GIL_PARK_RING_LEN;
		int depth = 0;
		for (Parked *a = tc->running; a != NULL && depth < SWITCH_MAX_DEPTH; a = a->parent, depth++)
			add(a, &d, s, first, tc->tid, tc->unseen);
	}
	tc->last = *c;
}

/* `next` (a reference stolen, or NULL) runs on this thread from now on. */
static void run(Charges *tc, Parked *next)
{
	Parked *old = tc->running;
	tc->running = next;
	Py_XDECREF(old);
}

/* The span's Parked (a new reference), or NULL. */
static Parked *parked_of(PyObject *span)
{
	PyObject *found = NULL;
	if (PyObject_GetOptionalAttr(span, s_parked_attr, &found) > 0 && Py_IS_TYPE(found, &ParkedType))
		return (Parked *)found;
	Py_XDECREF(found);
	return NULL;
}

/* A switch seen by a hook: charge what ran, then whose code runs in the context now current. */
static void switched(Charges *tc, Parked *next /* stolen; NULL: look it up */, int look_up)
{
	struct tally c;
	const volatile struct gil_slot *s;
	int step = counters_now(tc, &c, &s);
	if (step == 1)
		charge(tc, &c, s);
	if (step == 0) {
		Py_XDECREF(next);
		return;
	}
	run(tc, look_up ? current_running(tc) : next);
	believe(tc);
}

/* ---------------------------------------------------------------- the module's functions */

/* track(address, nslots, var, key): charge each span its own parks from now on, read from the
 * park ring at address (nslots slots); var: OpenTelemetry's ContextVar of the current context,
 * key: the current span's key in it. Raises where Context.run cannot be hooked. */
static PyObject *track(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
	if (nargs != 4 || !PyLong_Check(args[0]) || !PyLong_Check(args[1]) || !PyContextVar_CheckExact(args[2]) ||
	    !PyUnicode_Check(args[3])) {
		PyErr_SetString(PyExc_TypeError, "track(address: int, nslots: int, var: ContextVar, key: str)");
		return NULL;
	}
	uintptr_t address = (uintptr_t)PyLong_AsUnsignedLongLong(args[0]);
	unsigned long slots = PyLong_AsUnsignedLong(args[1]);
	if (PyErr_Occurred())
		return NULL;
	if (!address || slots < 1 || slots > 65536) {
		PyErr_SetString(PyExc_ValueError, "track: no ring at that address and size");
		return NULL;
	}
	PyMutex_Lock(&api_lock);
	int failed = hook_context_run();
	if (!failed) {
		if (otel_var != args[2] || span_key != args[3]) { /* the old ones leak: a thread may be using them */
			__atomic_store_n(&otel_var, Py_NewRef(args[2]), __ATOMIC_RELEASE);
			__atomic_store_n(&span_key, Py_NewRef(args[3]), __ATOMIC_RELEASE);
		}
		__atomic_store_n(&ring_base, (const char *)address, __ATOMIC_RELEASE);
		__atomic_store_n(&ring_slots, (uint32_t)slots, __ATOMIC_RELEASE);
		__atomic_fetch_add(&generation, 1, __ATOMIC_ACQ_REL);
		__atomic_store_n(&tracking, 1, __ATOMIC_RELEASE);
	}
	PyMutex_Unlock(&api_lock);
	if (failed)
		return NULL;
	Py_RETURN_NONE;
}

/* untrack(): no more charge points (threads' greenlet tracers stay, idle). */
static PyObject *untrack(PyObject *module, PyObject *unused)
{
	PyMutex_Lock(&api_lock);
	__atomic_store_n(&tracking, 0, __ATOMIC_RELEASE);
	__atomic_fetch_add(&generation, 1, __ATOMIC_ACQ_REL); /* a span in flight missed charges since */
	unhook_context_run();
	PyMutex_Unlock(&api_lock);
	Py_RETURN_NONE;
}

/* start(span, span_id, parent_id): a span starts on this thread: charge what ran until now, then
 * its code runs; its Parked (also the span's _otel_gil_parked), or None when not tracking. */
static PyObject *start(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
	if (nargs != 3) {
		PyErr_SetString(PyExc_TypeError, "start(span, span_id, parent_id)");
		return NULL;
	}
	uint64_t span_id = PyLong_AsUnsignedLongLong(args[1]), parent_id = PyLong_AsUnsignedLongLong(args[2]);
	if (PyErr_Occurred())
		return NULL;
	Charges *tc = charges_here();
	if (tc == NULL)
		return NULL;
	struct tally c;
	const volatile struct gil_slot *s;
	int step = counters_now(tc, &c, &s);
	if (step == 0)
		Py_RETURN_NONE;
	if (tc->tracer == NULL)
		trace_greenlets(&tc->modules, &tc->tracer);
	check_loop(tc);
	if (step == 1) {
		check_unseen(tc);
		charge(tc, &c, s);
	}
	Parked *p = PyObject_New(Parked, &ParkedType);
	if (p == NULL)
		return NULL;
	memset((char *)p + sizeof(PyObject), 0, sizeof(Parked) - sizeof(PyObject));
	p->span_id = span_id;
	p->start_ns = clock_ns(CLOCK_MONOTONIC);
	p->generation = tc->generation;
	p->home_tid = tc->tid;
	for (Parked *a = tc->running; parent_id && a != NULL && p->parent == NULL; a = a->parent)
		if (a->span_id == parent_id)
			p->parent = (Parked *)Py_NewRef(a);
	if (parent_id && p->parent == NULL) {
		Parked *current = current_running(tc);
		if (current != NULL && current->span_id == parent_id)
			p->parent = current;
		else
			Py_XDECREF(current);
	}
	p->prev_running = (Parked *)Py_XNewRef(tc->running);
	if (PyObject_SetAttr(args[0], s_parked_attr, (PyObject *)p)) {
		Py_DECREF(p);
		return NULL;
	}
	run(tc, (Parked *)Py_NewRef(p));
	believe(tc);
	return (PyObject *)p;
}

/* end(parked): its span ends on this thread: charge what ran until now, then what ran before it
 * runs again. Its figures: (parked_ns by kind, parks, [(start_ns, end_ns, kind, type)] of its
 * long parks, long parks dropped, ns since it started, ns parked on its home thread, ns parked
 * on others, how many others (-1: more than 8)); None where they are unknown (a switch unseen,
 * counters that went back, tracking restarted or a fork since it started). */
static PyObject *end(PyObject *module, PyObject *arg)
{
	if (!Py_IS_TYPE(arg, &ParkedType)) {
		PyErr_SetString(PyExc_TypeError, "end(parked: Parked)");
		return NULL;
	}
	Parked *p = (Parked *)arg;
	Charges *tc = charges_here();
	if (tc == NULL)
		return NULL;
	struct tally c;
	const volatile struct gil_slot *s;
	if (counters_now(tc, &c, &s) == 1) {
		check_unseen(tc);
		charge(tc, &c, s);
	}
	if (tc->running == p) {
		Parked *prev = p->prev_running;
		p->prev_running = NULL;
		run(tc, prev);
	} else {
		Py_CLEAR(p->prev_running);
	}
	believe(tc);
	if (tc->tid == p->home_tid && tc->unseen)
		flag_chain(p, UNSEEN);
	uint64_t elapsed = clock_ns(CLOCK_MONOTONIC) - p->start_ns;
	PyMutex_Lock(&p->mutex);
	struct Parked copy = *p;
	PyMutex_Unlock(&p->mutex);
	if (copy.flags || copy.generation != __atomic_load_n(&generation, __ATOMIC_ACQUIRE))
		Py_RETURN_NONE;
	uint64_t first = copy.long_parks > GIL_PARK_RING_LEN ? copy.long_parks - GIL_PARK_RING_LEN : 0;
	PyObject *longs = PyList_New(0);
	for (uint64_t i = first; longs != NULL && i < copy.long_parks; i++) {
		const struct gil_long_park *lp = &copy.ring[i & (GIL_PARK_RING_LEN - 1)];
		PyObject *row = Py_BuildValue("(KKIy#)", (unsigned long long)lp->start_ns, (unsigned long long)lp->end_ns,
					      lp->kind, lp->type, (Py_ssize_t)strnlen(lp->type, GIL_PARK_TYPE));
		if (row == NULL || PyList_Append(longs, row))
			Py_CLEAR(longs);
		Py_XDECREF(row);
	}
	if (longs == NULL)
		return NULL;
	return Py_BuildValue("((KKKKK)KNKKKKi)", (unsigned long long)copy.ns[0], (unsigned long long)copy.ns[1],
			     (unsigned long long)copy.ns[2], (unsigned long long)copy.ns[3],
			     (unsigned long long)copy.ns[4], (unsigned long long)copy.parks, longs,
			     (unsigned long long)first, (unsigned long long)elapsed,
			     (unsigned long long)copy.home_ns, (unsigned long long)copy.else_ns, (int)copy.threads_else);
}

static void after_fork_child(void)
{
	memset(&api_lock, 0, sizeof(api_lock));
	generation++; /* one thread: the slots were started afresh for this pid */
}

static PyMethodDef methods[] = {
	{"track", (PyCFunction)(void (*)(void))track, METH_FASTCALL,
	 "track(address, nslots, var, key): charge each span its own parks at every switch of context."},
	{"untrack", untrack, METH_NOARGS, "No more charge points."},
	{"start", (PyCFunction)(void (*)(void))start, METH_FASTCALL,
	 "start(span, span_id, parent_id) -> Parked | None: a span starts on this thread."},
	{"end", end, METH_O, "end(parked) -> figures | None: its span ends on this thread."},
	{NULL, NULL, 0, NULL},
};

static int exec_module(PyObject *m)
{
	struct {
		PyObject **slot;
		const char *text;
	} names[] = {
		{&s_charges_key, "otel_gil.park_charges"}, {&s_parked_attr, "_otel_gil_parked"},
	};
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (*names[i].slot == NULL && (*names[i].slot = PyUnicode_InternFromString(names[i].text)) == NULL)
			return -1;
	if (switch_hooks_init() || PyType_Ready(&ParkedType) || PyType_Ready(&ChargesType) ||
	    PyModule_AddObjectRef(m, "Parked", (PyObject *)&ParkedType))
		return -1;
	static int forks_hooked;
	if (!__atomic_exchange_n(&forks_hooked, 1, __ATOMIC_ACQ_REL) && pthread_atfork(NULL, NULL, after_fork_child)) {
		PyErr_SetFromErrno(PyExc_OSError);
		return -1;
	}
	return 0;
}

static PyModuleDef_Slot slots[] = {
	{Py_mod_exec, exec_module},
	{Py_mod_gil, Py_MOD_GIL_NOT_USED},
	{0, NULL},
};

static struct PyModuleDef module_def = {
	PyModuleDef_HEAD_INIT,
	.m_name = "otel_gil._parkcontexts",
	.m_doc = "Free-threaded builds: each span's own parked time, charged at every switch of context "
		 "(otel_gil/park_contexts.c).",
	.m_size = 0,
	.m_methods = methods,
	.m_slots = slots,
};

PyMODINIT_FUNC PyInit__parkcontexts(void)
{
	return PyModuleDef_Init(&module_def);
}

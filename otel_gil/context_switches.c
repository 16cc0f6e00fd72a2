/* Figures follow the context, not the thread: each span's own GIL time.
 *
 * On an event loop or a greenlet hub many requests share one OS thread, so a thread's
 * slot deltas over a span's lifetime are everyone's. Every point where a thread
 * switches from one context's code to another's is therefore a charge point: the
 * thread's slot counters there, minus those at its previous charge point, belong to
 * the span that ran in between (and to its ancestors: a child's own code is its
 * parent's too). Charge points:
 *   - a context switch, seen by
 *       3.14+     PyContext_AddWatcher (Py_CONTEXT_SWITCHED): every Context enter and
 *                 exit: asyncio task steps (eager ones too), uvloop's callbacks, and
 *                 to_thread, anyio and asgiref workers;
 *       3.9-3.13  contextvars.Context.run, replaced in the type: stdlib loops run every
 *                 task step and callback through it (Handle._run), and so do those workers;
 *       3.9-3.13  the GOT entries of PyContext_Enter/Exit in extension modules that
 *                 enter contexts in C (module_switches.c): uvloop's callbacks;
 *       greenlet.settrace (per thread, set at its first span): gevent, eventlet;
 *   - a span's start (it runs from then on) and end (what ran before it runs again).
 * Whose code runs after a switch: the span current in the context switched to
 * (OpenTelemetry's ContextVar), if these hooks snapshot it.
 *
 * Switches no hook sees (uvloop where its GOT cannot be hooked, other C extensions
 * entering contexts, greenlets switched before their thread's trace was set) are caught where they can
 * be: at a charge point, a context other than the one last switched to whose span is
 * not the one running; and, before 3.14, a running loop that is not a stdlib loop.
 * The thread is then marked for good, and every span its charges reach says
 * gil.status=shared_thread instead of giving a hold.
 *
 * Everything here runs with the GIL held, per OS thread: a Charges object in the
 * thread state's dict (gone with the thread), cached in TLS.
 */
#include "fastspan.h"

#define LOG_LEN 1024   /* switches a shared thread logs, for blame (a power of 2) */
#define LOG_BLOCK 64   /* entries whose names are released together, as their overwrite starts */
#define LOG_KEPT (LOG_LEN - LOG_BLOCK) /* switches blame reads back: the rest may be being overwritten */

/* The span hooks whose ring the charges are read from (a new reference), NULL: off. */
static Hooks *tracking;
static uint64_t epoch = 1; /* bumped as tracking stops: a span started before missed charges since */
static PyObject *otel_var; /* OpenTelemetry's ContextVar of the current context */
static PyObject *span_key; /* its key of the current span */
static PyObject *s_charges_key, *s_parent, *s_context, *s_name;
static Py_ssize_t logs; /* threads' Charges with a log (none: held_by has no thread to look for) */

/* ---------------------------------------------------------------- per thread */

/* Who ran from when: the span's id and name, not its Start (a Start held here would be
 * released 1,024 switches later, cold, with its parents and the rest). */
struct switch_entry {
	uint64_t at_ns;
	uint64_t span_id;
	PyObject *name; /* NULL: no span's code, or a span without a name */
	int someone;    /* a span's code ran */
};

#define SEEN_LEN 16 /* contexts a thread remembers the span's Start of (a power of 2) */

/* A context (by its immutable key) and the Start of its current span. */
struct seen {
	PyObject *key; /* switch_hooks.h's context_key */
	Start *running;
};

typedef struct {
	PyObject_HEAD
	/* What every charge point reads or writes first, together. */
	PyThreadState *tstate; /* the thread state whose dict keeps it (switch_hooks.h) */
	Start *running;       /* whose code runs now; NULL: no span's */
	PyObject *context;    /* tstate->context as of the last charge point */
	uint64_t switches;    /* context switches seen on this thread */
	PyObject *ring;       /* the ring `last` was read from */
	long generation;
	unsigned long forks;
	struct counters last; /* the thread's counters at its last charge point */
	uint32_t tid;
	int unseen;           /* a switch no hook saw changed whose code ran here */
	struct switch_entry *log; /* who ran from when (LOG_LEN, from the thread's first switch) */
	uint64_t logged;
	PyObject *spare_run;  /* a freed ctx.run bound, for the next (switch_hooks.h) */
	/* Then what spans and loops read. */
	void *owner;          /* &here of its thread */
	PyObject *loop;       /* the running loop last checked (before 3.14) */
	int loop_seen;        /* ... whose switches are seen */
	uint64_t loopless;    /* its thread state dict's version when asyncio last said no loop ran (0: never) */
	PyObject *tracer;     /* this thread's greenlet tracer, once set */
	Py_ssize_t modules;   /* len(sys.modules) when greenlet was last looked for */
	int remembered;       /* entries of seen and by_otel with a Start (switch_hooks.h) */
	struct seen seen[SEEN_LEN]; /* by the context's key: a switch back finds its Start here */
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
	Py_XDECREF(self->ring);
	Py_XDECREF(self->running);
	Py_XDECREF(self->context);
	Py_XDECREF(self->loop);
	Py_XDECREF(self->tracer);
	if (self->spare_run != NULL)
		PyObject_GC_Del(self->spare_run);
	if (self->log != NULL) {
		for (int i = 0; i < LOG_LEN; i++)
			Py_XDECREF(self->log[i].name);
		PyMem_Free(self->log);
		logs--;
	}
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
	.tp_name = "otel_gil._fastspan.Charges",
	.tp_basicsize = sizeof(Charges),
	.tp_dealloc = (destructor)Charges_dealloc,
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "One thread's charge point: its counters then and whose code runs since.",
};

/* The thread's Charges, Context.run's replacement, the greenlet tracer (switch_hooks.h). */
#define SWITCH_HOOKS_MODULE "otel_gil._fastspan"
#define SWITCH_TRACKING (tracking != NULL)
#define SWITCH_RUNNING Start
#define SWITCH_UNSEEN OWN_UNSEEN
#define SWITCH_FLAG(a, flag) ((a)->own.flags |= (flag))
#define SWITCH_OTEL_VAR otel_var
#define SWITCH_SPAN_KEY span_key
#define SWITCH_OF_SPAN start_of
#define SWITCH_LOOP_SEEN module_switches_loop
static Start *start_of(PyObject *span);
#include "switch_hooks.h"

/* ---------------------------------------------------------------- charging */

static void add(Start *a, const struct counters *d, uint32_t tid, int unseen)
{
	struct own *o = &a->own;
	if (unseen)
		o->flags |= OWN_UNSEEN;
	if (tid == a->home_tid) {
		o->hold_home += d->hold_ns;
		o->acquisitions_home += d->acquisitions;
		return;
	}
	o->wait_else += d->wait_ns;
	o->hold_else += d->hold_ns;
	o->acquisitions_else += d->acquisitions;
	o->convoy_else += d->convoy_waits;
	if (!(d->wait_ns || d->hold_ns) || o->threads_else == OWN_MANY)
		return;
	for (uint32_t i = 0; i < o->threads_else; i++)
		if (o->tids_else[i] == tid)
			return;
	if (o->threads_else == OWN_TIDS)
		o->threads_else = OWN_MANY;
	else
		o->tids_else[o->threads_else++] = tid;
}

/* Charge the thread's counters since its last charge point (`c`, now) to the span
 * running there and its ancestors. */
static void charge(Charges *tc, const struct counters *c)
{
	const struct counters *l = &tc->last;
	if (c->wait_ns < l->wait_ns || c->hold_ns < l->hold_ns || c->acquisitions < l->acquisitions ||
	    c->convoy_waits < l->convoy_waits) {
		flag_chain(tc->running, OWN_BROKEN);
	} else if (tc->running != NULL) {
		struct counters d = {c->wait_ns - l->wait_ns, c->hold_ns - l->hold_ns, c->acquisitions - l->acquisitions,
				     c->convoy_waits - l->convoy_waits, 0};
		int depth = 0;
		for (Start *a = tc->running; a != NULL && depth < SWITCH_MAX_DEPTH; a = a->parent, depth++)
			add(a, &d, tc->tid, tc->unseen);
	}
	tc->last = *c;
}

/* in_step() for a ring new to this thread: charging starts at `c`. */
static SWITCH_COLD int new_step(Charges *tc, const struct counters *c)
{
	Hooks *h = tracking;
	Py_INCREF(h->ring);
	Py_XSETREF(tc->ring, h->ring);
	tc->generation = h->generation;
	tc->forks = forks;
	tc->tid = (uint32_t)tls.tid;
	tc->last = *c;
	tc->unseen = 0; /* a new ring: a thread that still runs unseen switches is caught again (check_loop, check_unseen) */
	Py_CLEAR(tc->loop);
	return 2;
}

/* Whether `c`, the calling thread's counters just read from the tracked ring, continue
 * its last charge point's (1), or the ring is new to this thread (a registration, a
 * collector restart, a fork: nothing to charge from before) and charging starts there (2). */
static inline int in_step(Charges *tc, const struct counters *c)
{
	Hooks *h = tracking;
	if (likely(tc->ring == h->ring && tc->generation == h->generation && tc->forks == forks))
		return 1;
	return new_step(tc, c);
}

/* The calling thread's counters now and in_step()'s answer, or 0 where there is no ring to read. */
static int counters_now(Charges *tc, struct counters *c, uint64_t *now)
{
	Hooks *h = tracking;
	if (h == NULL || h->ring == NULL || h->base == NULL)
		return 0;
	thread_for(h->registration, h->generation);
	*now = clock_ns(CLOCK_MONOTONIC);
	read_counters(h->base, h->nslots, *now, c);
	return in_step(tc, c);
}

/* The names of the log's LOG_BLOCK entries from `e` released, as their overwrite starts: in one
 * pass over them, not each read back cold (1,024 switches after it was written) at its overwrite. */
static SWITCH_COLD void release_block(struct switch_entry *e)
{
	for (int i = 0; i < LOG_BLOCK; i++)
		Py_CLEAR(e[i].name);
}

/* `next` (a reference stolen, or NULL) runs on this thread from `now` on. */
static inline void run(Charges *tc, Start *next, uint64_t now)
{
	Start *old = tc->running;
	tc->running = next;
	if (tc->log != NULL) {
		uint64_t i = tc->logged++ & (LOG_LEN - 1);
		struct switch_entry *e = &tc->log[i];
		if (unlikely(i % LOG_BLOCK == 0))
			release_block(e);
		e->at_ns = now;
		e->span_id = next ? next->span_id : 0;
		e->someone = next != NULL;
		e->name = next ? next->name : NULL; /* (its entry's name was released with its block) */
		Py_XINCREF(e->name);
	}
	Py_XDECREF(old);
}

/* The span's tracked Start (a new reference), or NULL. */
static Start *start_of(PyObject *span)
{
	PyObject *found = lookup(span, s_start_attr);
	if (found != NULL && Py_IS_TYPE(found, &StartType) && ((Start *)found)->tracked)
		return (Start *)found; /* (tracked for good once its span started: a context's answer stays right) */
	Py_XDECREF(found);
	return NULL;
}

/* The thread's switch log, at its first switch. */
static SWITCH_COLD void start_log(Charges *tc)
{
	if ((tc->log = PyMem_Calloc(LOG_LEN, sizeof(struct switch_entry))) == NULL)
		PyErr_Clear(); /* no blame by request on this thread, figures unaffected */
	else
		logs++;
}

/* A switch seen by a hook: charge what ran, then whose code runs in the context now current.
 * Where that is the code that ran (the same span's, or no span's), nothing is charged or
 * logged: the next charge point charges the whole stretch to it, as these would have. */
static SWITCH_HOT void switched(Charges *tc, Start *next /* stolen; NULL: look it up */, int look_up)
{
	if (look_up)
		next = current_running(tc);
	tc->switches++;
	if (next == tc->running && tc->log != NULL) {
		Py_XDECREF(next);
		believe(tc);
		return;
	}
	struct counters c;
	uint64_t now = 0;
	if (counters_now(tc, &c, &now) == 1)
		charge(tc, &c);
	if (now == 0)
		now = clock_ns(CLOCK_MONOTONIC);
	if (unlikely(tc->log == NULL))
		start_log(tc);
	run(tc, next, now);
	believe(tc);
}

/* ---------------------------------------------------------------- span start and end */

static uint64_t span_id_of(PyObject *span_context)
{
	if (span_context == NULL || !PyTuple_Check(span_context) || PyTuple_GET_SIZE(span_context) < 3)
		return 0;
	int ok;
	uint64_t id = ulong_value(PyTuple_GET_ITEM(span_context, 1), &ok); /* LP64: as wide as uint64_t */
	return ok ? id : 0;
}

/* The tracked Start of the span's local parent (a new reference), or NULL; parent: its
 * SpanContext, or NULL (stolen). */
static Start *parent_of(Charges *tc, PyObject *parent)
{
	uint64_t id = span_id_of(parent);
	int remote = id && PyObject_IsTrue(PyTuple_GET_ITEM(parent, 2)) == 1;
	Py_XDECREF(parent);
	clear_error_in(tc->tstate);
	if (!id || remote)
		return NULL;
	int depth = 0;
	for (Start *a = tc->running; a != NULL && depth < SWITCH_MAX_DEPTH; a = a->parent, depth++)
		if (a->span_id == id) {
			Py_INCREF(a);
			return a;
		}
	Start *current = current_running(tc);
	if (current != NULL && current->span_id == id)
		return current;
	Py_XDECREF(current);
	return NULL;
}

/* Whether the switch hooks charge these hooks' spans. */
int tracking_contexts(Hooks *hooks)
{
	return tracking == hooks;
}

/* Whether contexts were tracked from this span's start on (else charges of its code are missing). */
int tracked_throughout(const Start *start)
{
	return start->tracked && start->epoch == epoch;
}

#if !PY_3_14_OR_LATER
/* check_loop, except where asyncio said no loop ran here and nothing changed since: its C
 * _get_running_loop reads the thread's loop from the thread state's dict, any change of
 * which gives the dict a new version tag (3.11-3.13; 3.14 keeps it in the thread state). */
static void check_loop_once(Charges *tc)
{
	PyObject *dict = here.tstate->dict;
_Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wdeprecated-declarations\"")
	uint64_t version = dict != NULL && PyDict_CheckExact(dict) ? ((PyDictObject *)dict)->ma_version_tag : 0;
_Pragma("GCC diagnostic pop")
	if (version != 0 && version == tc->loopless)
		return;
	/* (the Python _get_running_loop, without _asyncio, keeps it in a threading.local) */
	tc->loopless = check_loop(tc) == 0 && running_loop_c != NULL ? version : 0;
}
#endif

/* A span started on this thread (its counters in start->counters, read just now): charge
 * what ran until now, then its code runs. Nothing when the hooks do not track contexts. */
void context_start(Hooks *hooks, Start *start, PyObject *span, PyThreadState *ts)
{
	if (tracking != hooks)
		return;
	Charges *tc = charges_in(ts);
	if (tc == NULL) {
		clear_error();
		return;
	}
	if (tc->tracer == NULL)
		trace_greenlets(&tc->modules, &tc->tracer);
#if !PY_3_14_OR_LATER
	if (tc->switches == 0 || tc->loop == NULL) /* a thread whose switches the hooks see runs a loop they see, if any */
		check_loop_once(tc);
#endif
	if (hooks->ring != start->ring)
		return;
	if (in_step(tc, &start->counters) == 1) {
		check_unseen(tc);
		charge(tc, &start->counters);
	}
	PyObject *f[3]; /* the span's context, name and parent */
	FIELDS(span, f, s_context, s_name, s_parent);
	start->span_id = span_id_of(f[0]);
	start->name = f[1];
	Py_XDECREF(f[0]);
	clear_error_in(ts);
	start->parent = parent_of(tc, f[2]);
	start->home_tid = tc->tid;
	start->switches = tc->switches;
	start->epoch = epoch;
	Py_XINCREF(tc->running);
	start->prev_running = tc->running;
	start->tracked = 1;
	Py_INCREF(start);
	run(tc, start, (uint64_t)start->mono_ns);
	believe(tc);
}

/* The Charges of the interpreter's thread with kernel tid `tid` that logs its switches (borrowed), or NULL. */
static Charges *switching_thread(unsigned long tid)
{
	if (logs == 0)
		return NULL;
	PyInterpreterState *interp = PyThreadState_GetInterpreter(PyThreadState_Get());
	for (PyThreadState *t = PyInterpreterState_ThreadHead(interp); t != NULL; t = PyThreadState_Next(t)) {
		PyObject *found = t->dict ? PyDict_GetItemWithError(t->dict, s_charges_key) : NULL;
		if (found == NULL)
			PyErr_Clear();
		else if (Py_IS_TYPE(found, &ChargesType) && ((Charges *)found)->tid == tid && ((Charges *)found)->log)
			return (Charges *)found;
	}
	return NULL;
}

/* The span `start` is named `name` from now on: so are its entries in the switch log (back to its start). */
static void rename_logged(Charges *tc, const Start *start, PyObject *name)
{
	if (tc->log == NULL)
		return;
	uint64_t oldest = tc->logged > LOG_KEPT ? tc->logged - LOG_KEPT : 0;
	for (uint64_t i = tc->logged; i > oldest; i--) {
		struct switch_entry *e = &tc->log[(i - 1) & (LOG_LEN - 1)];
		if (e->at_ns < (uint64_t)start->mono_ns)
			break;
		if (e->someone && e->span_id == start->span_id && e->name == start->name) {
			Py_INCREF(name);
			Py_XSETREF(e->name, name);
		}
	}
}

/* A tracked span ends on this thread: charge what ran until now, then what ran before
 * it runs again. Before its figures are read: the instant charged to (CLOCK_MONOTONIC), for
 * them to be read at; 0 where none was. */
uint64_t context_end(Start *start, PyObject *name, PyThreadState *ts)
{
	Charges *tc = charges_in(ts);
	if (tc == NULL) {
		clear_error();
		Py_CLEAR(start->prev_running);
		return 0;
	}
	if (name != NULL && name != start->name) { /* blame names it as it ends (a server span gets its route late) */
		Charges *home = tc->tid == start->home_tid ? tc : switching_thread(start->home_tid);
		if (home != NULL)
			rename_logged(home, start, name);
		Py_INCREF(name);
		Py_XSETREF(start->name, name);
	}
	struct counters c;
	uint64_t now = 0;
	if (counters_now(tc, &c, &now) == 1) {
		check_unseen(tc);
		charge(tc, &c);
	}
	if (tc->running == start) {
		Start *prev = start->prev_running;
		start->prev_running = NULL;
		if (now == 0)
			now = clock_ns(CLOCK_MONOTONIC);
		run(tc, prev, now);
	} else {
		Py_CLEAR(start->prev_running);
	}
	believe(tc);
	if (tc->tid == start->home_tid) {
		start->switched = tc->switches != start->switches;
		if (tc->unseen)
			start->own.flags |= OWN_UNSEEN;
	}
	forget_running(tc, start);
	return now;
}

/* ---------------------------------------------------------------- the switch hooks */

/* context_switched() where the caller has an exception set: kept aside meanwhile. */
static SWITCH_COLD void switched_keeping_error(void)
{
	PyObject *type, *value, *traceback;
	PyErr_Fetch(&type, &value, &traceback);
	Charges *tc = charges_here();
	if (tc != NULL)
		switched(tc, NULL, 1);
	PyErr_Clear();
	PyErr_Restore(type, value, traceback);
}

SWITCH_HOT void context_switched(void)
{
	if (tracking == NULL)
		return;
	if (unlikely(PyErr_Occurred() != NULL)) {
		switched_keeping_error();
		return;
	}
	Charges *tc = charges_here();
	if (tc != NULL) {
		switched(tc, NULL, 1);
		clear_error_in(tc->tstate);
	} else {
		clear_error();
	}
}

#if !PY_3_14_OR_LATER
static int hook_switches(void)
{
	return hook_context_run();
}

static void unhook_switches(void)
{
	unhook_context_run();
}
#else
static int watcher = -1;

/* Every Context enter and exit: a charge point. Called with any exception of the caller set. */
static int on_context_switched(PyContextEvent event, PyObject *ctx)
{
	if (event == Py_CONTEXT_SWITCHED)
		context_switched();
	return 0;
}

static int hook_switches(void)
{
	if (watcher < 0)
		watcher = PyContext_AddWatcher(on_context_switched);
	return watcher < 0 ? -1 : 0;
}

static void unhook_switches(void)
{
	if (watcher >= 0 && PyContext_ClearWatcher(watcher) == 0)
		watcher = -1;
	PyErr_Clear();
}
#endif

/* _fastspan.track_contexts(hooks, var, key): from now on the spans these hooks snapshot get
 * their own code's figures; var: OpenTelemetry's ContextVar of the current context, key:
 * the current span's key in it. Raises where switches cannot be hooked. */
PyObject *contexts_track(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
	if (nargs != 3 || !PyObject_TypeCheck(args[0], &HooksType) || !PyContextVar_CheckExact(args[1]) ||
	    !PyUnicode_Check(args[2])) {
		PyErr_SetString(PyExc_TypeError, "track_contexts(hooks: Hooks, var: ContextVar, key: str)");
		return NULL;
	}
	if (hook_switches())
		return NULL;
	module_switches_hook();
	Py_INCREF(args[0]);
	Py_INCREF(args[1]);
	Py_INCREF(args[2]);
	Py_XSETREF(otel_var, args[1]);
	Py_XSETREF(span_key, args[2]);
	Py_XSETREF(tracking, (Hooks *)args[0]);
	Py_RETURN_NONE;
}

/* _fastspan.untrack_contexts(): no more charge points (threads' greenlet tracers stay, idle). */
/* _fastspan.hook_loop_modules(): hook the loop modules loaded now, while contexts are tracked
 * (called as one is imported: its GOT is patched then, not at the first span on its loop). */
PyObject *contexts_hook_modules(PyObject *module, PyObject *unused)
{
	if (tracking != NULL)
		module_switches_hook();
	Py_RETURN_NONE;
}

PyObject *contexts_untrack(PyObject *module, PyObject *unused)
{
	if (tracking != NULL)
		epoch++;
	Py_CLEAR(tracking);
	unhook_switches();
	module_switches_unhook();
	Py_RETURN_NONE;
}

#define TALLY 32

/* _fastspan.held_by(tid, start_ns, end_ns): on a thread whose contexts switch (an event loop, a
 * greenlet hub), the (name, span id) of the span whose code ran there longest within
 * [start_ns, end_ns) (monotonic), () if no span's code ran longer than no span's (the loop's
 * own work, or before the log reaches back); None for a thread that never switched (its
 * current span tells). For blame. */
PyObject *contexts_held_by(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
	if (nargs != 3) {
		PyErr_SetString(PyExc_TypeError, "held_by(tid, start_ns, end_ns)");
		return NULL;
	}
	unsigned long tid = PyLong_AsUnsignedLong(args[0]);
	uint64_t start = PyLong_AsUnsignedLongLong(args[1]), end = PyLong_AsUnsignedLongLong(args[2]);
	if (PyErr_Occurred())
		return NULL;
	Charges *tc = switching_thread(tid);
	if (tc == NULL)
		Py_RETURN_NONE;
	struct {
		uint64_t span_id;
		PyObject *name;
		uint64_t ns;
	} tally[TALLY];
	int n = 0;
	uint64_t nobody = 0; /* the loop's own code, and what ran before the log reaches back */
	uint64_t oldest = tc->logged > LOG_KEPT ? tc->logged - LOG_KEPT : 0, until = clock_ns(CLOCK_MONOTONIC);
	for (uint64_t i = tc->logged; i > oldest && until > start; i--) {
		struct switch_entry *e = &tc->log[(i - 1) & (LOG_LEN - 1)];
		uint64_t from = e->at_ns > start ? e->at_ns : start, to = until < end ? until : end;
		until = e->at_ns;
		if (to <= from)
			continue;
		if (!e->someone) {
			nobody += to - from;
			continue;
		}
		int k = 0;
		while (k < n && (tally[k].span_id != e->span_id || tally[k].name != e->name))
			k++;
		if (k == n && n < TALLY)
			tally[n++] = (typeof(tally[0])){e->span_id, e->name, 0};
		if (k < n)
			tally[k].ns += to - from;
	}
	if (until > start)
		nobody += (until < end ? until : end) - start;
	int best = -1;
	for (int k = 0; k < n; k++)
		if (tally[k].name != NULL && (best < 0 || tally[k].ns > tally[best].ns))
			best = k;
	if (best < 0 || tally[best].ns <= nobody) /* mostly no span's code: name none rather than a bystander */
		return PyTuple_New(0);
	char id[17];
	PyOS_snprintf(id, sizeof(id), "%016llx", (unsigned long long)tally[best].span_id);
	return Py_BuildValue("(Os)", tally[best].name, id);
}

int contexts_switching(unsigned long tid)
{
	return switching_thread(tid) != NULL;
}

int contexts_init(PyObject *module)
{
	struct {
		PyObject **slot;
		const char *text;
	} names[] = {
		{&s_charges_key, "otel_gil.charges"}, {&s_parent, "_parent"}, {&s_context, "_context"},
		{&s_name, "_name"},
	};
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if ((*names[i].slot = PyUnicode_InternFromString(names[i].text)) == NULL)
			return -1;
	return switch_hooks_init() || PyType_Ready(&ChargesType);
}

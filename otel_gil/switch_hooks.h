/* What both charge-point modules share: context_switches.c (each span's own GIL time, default
 * builds) and park_contexts.c (its own parked time, free-threaded builds).
 *   - a thread's Charges: kept in its thread state's dict (gone with the thread), cached in TLS;
 *     and the check, at a span's start or end, for a context entered behind the hooks' back;
 *   - contextvars.Context.run, replaced in the type: stdlib loops run every task step and
 *     callback through it (Handle._run), and so do to_thread, anyio and asgiref workers;
 *   - greenlet.settrace's callback, set per thread (chaining the tracer there was).
 * Both are charge points: on entering a context (whose code runs then is looked up in it),
 * on leaving it (what ran before runs again), at a greenlet switch.
 *
 * The includer defines, before including this: SWITCH_HOOKS_MODULE (its module's name, naming
 * the types), SWITCH_TRACKING (an expression: whether the charge points charge now),
 * SWITCH_RUNNING (the type of what runs: a span's accumulator, with a `parent` of its type),
 * SWITCH_UNSEEN (the accumulator flag of a switch unseen), SWITCH_FLAG(a, flag) (sets an
 * accumulator's flag), SWITCH_OTEL_VAR and SWITCH_SPAN_KEY (OpenTelemetry's ContextVar and its
 * span key, NULL until known), SWITCH_OF_SPAN(span) (a span's accumulator, a new reference, or
 * NULL) and SWITCH_LOOP_SEEN(loop) (whether a running loop that is not a stdlib one has its
 * switches seen all the same); its Charges type (fields owner, running, context, unseen, loop,
 * loop_seen, tstate, seen[SEEN_LEN] and by_otel[SEEN_LEN] (struct seen: key, running), remembered (an int: how
 * many of their entries have a running), spare_run: a freed BoundRun its
 * dealloc frees with PyObject_GC_Del), ChargesType, `here` (TLS: tstate, charges) and
 * s_charges_key; and, anywhere in the file, `switched(Charges *, SWITCH_RUNNING *next, int
 * look_up)` (a charge point, after which `next`, stolen, runs, or with look_up whoever is current
 * in the context).
 * Nothing here needs the GIL: Context's dict is changed under the includer's own serialisation
 * (the GIL, or a lock), and a tracer, a Charges and its TLS belong to one thread.
 */
#ifndef OTEL_GIL_SWITCH_HOOKS_H
#define OTEL_GIL_SWITCH_HOOKS_H

#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>

#include "py_versions.h"

/* Before 3.14 a Context's variables are read in place (its layout, the same from 3.9 to 3.13, from
 * CPython's own header); 3.14+ takes the public ContextVar look-up. */
#define CONTEXT_VARS_IN_PLACE (!PY_3_14_OR_LATER)
#if CONTEXT_VARS_IN_PLACE
#define Py_BUILD_CORE
#include "internal/pycore_context.h"
#undef Py_BUILD_CORE
#endif

#if !defined(SWITCH_HOOKS_MODULE) || !defined(SWITCH_TRACKING) || !defined(SWITCH_RUNNING) || \
	!defined(SWITCH_UNSEEN) || !defined(SWITCH_FLAG) || !defined(SWITCH_OTEL_VAR) || !defined(SWITCH_SPAN_KEY) || \
	!defined(SWITCH_OF_SPAN) || !defined(SWITCH_LOOP_SEEN)
#error "define SWITCH_HOOKS_MODULE, SWITCH_TRACKING, SWITCH_RUNNING, SWITCH_UNSEEN, SWITCH_FLAG, SWITCH_OTEL_VAR, SWITCH_SPAN_KEY, SWITCH_OF_SPAN and SWITCH_LOOP_SEEN first"
#endif

#define SWITCH_MAX_DEPTH 64 /* ancestors charged at most (a cycle cannot form: parents are older) */

#define SWITCH_UNUSED __attribute__((unused)) /* (3.14+ default builds need no Context.run) */
/* The charge points' own code is touched once per switch, between stretches of the interpreter's
 * that evict it: what every switch runs is kept together (hot), what few do out of its way (cold). */
#define SWITCH_HOT __attribute__((hot))
#define SWITCH_COLD __attribute__((noinline, cold))
#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)

static PyObject *s_switch_run, *s_switch_settrace, *s_switch_greenlet, *s_switch_events, *s_switch_base_events;

static void switched(Charges *tc, SWITCH_RUNNING *next, int look_up);

/* Each span from `a` up its ancestors gets `flag`. */
static void flag_chain(SWITCH_RUNNING *a, uint32_t flag)
{
	for (int depth = 0; a != NULL && depth < SWITCH_MAX_DEPTH; a = a->parent, depth++)
		SWITCH_FLAG(a, flag);
}

/* ---------------------------------------------------------------- per thread */

/* charges_here() where the TLS cache does not answer: from the thread state's dict, or made. */
static SWITCH_COLD Charges *charges_of(PyThreadState *ts)
{
	PyObject *dict = PyThreadState_GetDict(); /* borrowed; this thread's only */
	if (dict == NULL) {
		PyErr_SetString(PyExc_RuntimeError, "no thread state dict");
		return NULL;
	}
	PyObject *found = NULL;
#if PY_3_13_OR_LATER
	if (PyDict_GetItemRef(dict, s_charges_key, &found) < 0)
		return NULL;
#else
	if ((found = PyDict_GetItemWithError(dict, s_charges_key)) == NULL && PyErr_Occurred())
		return NULL;
	Py_XINCREF(found);
#endif
	if (found == NULL || !Py_IS_TYPE(found, &ChargesType)) {
		Py_XDECREF(found);
		Charges *made = PyObject_New(Charges, &ChargesType);
		if (made == NULL)
			return NULL;
		memset((char *)made + sizeof(PyObject), 0, sizeof(Charges) - sizeof(PyObject));
		made->owner = (void *)&here;
		if (PyDict_SetItem(dict, s_charges_key, (PyObject *)made)) {
			Py_DECREF(made);
			return NULL;
		}
		found = (PyObject *)made;
	}
	Py_DECREF(found); /* the thread state's dict keeps it */
	((Charges *)found)->tstate = ts;
	here.tstate = ts;
	here.charges = (Charges *)found;
	return here.charges;
}

/* The Charges (borrowed) of the calling thread, whose state is ts; NULL with an error if it
 * cannot have one. Its tstate is ts until the caller returns (a call into Python gives the
 * thread its state back as it returns): what charge points read of the state, with no look-up
 * (from 3.12 each costs a call into libpython's thread-local storage). */
static inline Charges *charges_in(PyThreadState *ts)
{
	if (unlikely(here.tstate != ts || here.charges == NULL))
		return charges_of(ts);
	return here.charges;
}

/* charges_in() the calling thread's state. */
static inline Charges *charges_here(void)
{
	return charges_in(PyThreadState_Get());
}

/* What the cache of a thread's contexts is keyed by: before 3.14, the current Context's mapping
 * of variables, read in place (immutable: a ContextVar.set makes a new one; a ContextVar look-up
 * per switch costs ~180 instructions and the mapping's nodes); from 3.14, OpenTelemetry's
 * context itself (a new reference in *octx). NULL: no context, or no span's. */
static inline PyObject *context_key(Charges *tc, PyObject **octx)
{
#if CONTEXT_VARS_IN_PLACE
	PyObject *ctx = tc->tstate->context;
	return ctx != NULL && SWITCH_OTEL_VAR != NULL ? (PyObject *)((PyContext *)ctx)->ctx_vars : NULL;
#else
	(void)tc;
	PyObject *var = SWITCH_OTEL_VAR;
	if (var == NULL || PyContextVar_Get(var, NULL, octx) < 0)
		PyErr_Clear();
	return *octx;
#endif
}

/* current_running() where tc does not remember `key`: its span's accumulator (a new reference),
 * or NULL, remembered in `seen`. octx: OpenTelemetry's context (a reference taken over), or NULL
 * where it is to be looked up; then found by it in tc->by_otel where it is there (a mapping
 * reset to an earlier value is a new one: a span's detach), else remembered there too. */
static SWITCH_COLD SWITCH_RUNNING *remember_running(Charges *tc, struct seen *seen, PyObject *key, PyObject *octx)
{
	SWITCH_RUNNING *running = NULL;
	struct seen *by_otel = NULL;
	PyObject *span = NULL;
	if (octx == NULL && PyContextVar_Get(SWITCH_OTEL_VAR, NULL, &octx) < 0)
		octx = NULL;
	if (octx != NULL && octx != key) {
		by_otel = &tc->by_otel[((uintptr_t)octx >> 4) & (SEEN_LEN - 1)];
		if (by_otel->key == octx) {
			running = by_otel->running;
			Py_XINCREF(running);
			goto found;
		}
	}
#if PY_3_13_OR_LATER
	if (octx != NULL && PyDict_Check(octx) && PyDict_GetItemRef(octx, SWITCH_SPAN_KEY, &span) > 0) {
#else
	if (octx != NULL && PyDict_Check(octx) && (span = PyDict_GetItemWithError(octx, SWITCH_SPAN_KEY)) != NULL) {
		Py_INCREF(span);
#endif
		running = SWITCH_OF_SPAN(span); /* (set as its span starts, before any context holds it) */
		Py_DECREF(span);
	}
	PyErr_Clear();
	if (by_otel != NULL) {
		Py_XINCREF(running);
		tc->remembered += (running != NULL) - (by_otel->running != NULL);
		Py_XSETREF(by_otel->running, running);
		Py_INCREF(octx);
		Py_XSETREF(by_otel->key, octx);
	}
found:
	Py_XDECREF(octx);
	Py_XINCREF(running);
	tc->remembered += (running != NULL) - (seen->running != NULL);
	Py_XSETREF(seen->running, running);
	Py_INCREF(key);
	Py_XSETREF(seen->key, key);
	return running;
}

/* The accumulator of the span current in this thread's context (a new reference), or NULL; tc
 * remembers it by the context's key (context_key). */
static inline SWITCH_RUNNING *current_running(Charges *tc)
{
	PyObject *octx = NULL, *key = context_key(tc, &octx);
	if (key == NULL)
		return NULL;
	struct seen *seen = &tc->seen[((uintptr_t)key >> 4) & (SEEN_LEN - 1)];
	if (unlikely(seen->key != key))
		return remember_running(tc, seen, key, octx);
	Py_XDECREF(octx);
	Py_XINCREF(seen->running);
	return seen->running;
}

/* `ended`'s span ended: tc forgets the contexts it remembered as running it (a context of an
 * ended span is rarely switched to again: its detach came first), so that what they hold (the
 * span, OpenTelemetry's context) is freed now, hot, as OpenTelemetry alone frees it, not some
 * switches later, cold. A context switched to again all the same is looked up anew. */
static SWITCH_UNUSED void forget_running(Charges *tc, SWITCH_RUNNING *ended)
{
	PyObject *gone[4 * SEEN_LEN];
	int n = 0;
	if (tc->remembered == 0) /* (no entry has a span: nothing to scan, as on a thread that never switched) */
		return;
	for (int i = 0; i < SEEN_LEN; i++) {
		struct seen *lists[] = {&tc->seen[i], &tc->by_otel[i]};
		for (int k = 0; k < 2; k++)
			if (lists[k]->running == ended && lists[k]->key != NULL) {
				gone[n++] = lists[k]->key;
				gone[n++] = (PyObject *)ended;
				lists[k]->key = NULL;
				lists[k]->running = NULL;
				tc->remembered--;
			}
	}
	while (n > 0) /* (after the lists are consistent: a deallocation may switch contexts) */
		Py_DECREF(gone[--n]);
}

/* The context current now is the one the last charge point saw. */
static void believe(Charges *tc)
{
	PyObject *ctx = tc->tstate->context;
	if (ctx != tc->context) {
		Py_XINCREF(ctx);
		Py_XSETREF(tc->context, ctx);
	}
}

/* At a span's start or end: a context entered behind the hooks' back, whose span is not the
 * running one, means the charges since went to the wrong span: the thread is marked for good. */
static void check_unseen(Charges *tc)
{
	PyObject *ctx = tc->tstate->context;
	if (tc->context == NULL || ctx == NULL || ctx == tc->context)
		return;
	SWITCH_RUNNING *there = current_running(tc);
	if (there != tc->running) {
		tc->unseen = 1;
		flag_chain(tc->running, SWITCH_UNSEEN);
		flag_chain(there, SWITCH_UNSEEN);
	}
	Py_XDECREF(there);
}

/* ---------------------------------------------------------------- Context.run */

typedef struct {
	PyObject_HEAD
	vectorcallfunc vectorcall;
	PyObject *original; /* the method it replaced */
} ContextRun;

static SWITCH_HOT PyObject *ContextRun_vectorcall(ContextRun *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
	Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
	Charges *tc;
	if (!(SWITCH_TRACKING) || nargs < 2 || !PyContext_CheckExact(args[0]) || (tc = charges_here()) == NULL) {
		if (PyErr_Occurred())
			PyErr_Clear();
		return PyObject_Vectorcall(self->original, args, nargsf, kwnames);
	}
	PyObject *ctx = args[0];
	if (PyContext_Enter(ctx))
		return NULL;
	SWITCH_RUNNING *before = tc->running;
	Py_XINCREF(before);
	Py_INCREF(tc); /* the same thread's, on the way back: kept, not looked up again */
	switched(tc, NULL, 1);
	PyObject *result = PyObject_Vectorcall(args[1], args + 2, (size_t)(nargs - 2), kwnames);
	if (PyContext_Exit(ctx))
		Py_CLEAR(result);
	PyObject *type = NULL, *value = NULL, *traceback = NULL;
	if (result == NULL)
		PyErr_Fetch(&type, &value, &traceback);
	switched(tc, before, 0);
	Py_DECREF(tc);
	if (PyErr_Occurred())
		PyErr_Clear();
	if (result == NULL)
		PyErr_Restore(type, value, traceback);
	return result;
}

static void ContextRun_dealloc(ContextRun *self)
{
	Py_XDECREF(self->original);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

/* ctx.run bound to its context, as Handle._run looks it up at every callback: a method object
 * without PyMethod's allocation (on builds with a GIL, a thread's Charges keeps one freed, in
 * spare_run, for the next). */
typedef struct {
	PyObject_HEAD
	vectorcallfunc vectorcall;
	ContextRun *run;
	PyObject *context;
} BoundRun;

static PyTypeObject BoundRunType;

#define BOUND_RUN_ARGS 8 /* arguments passed on the stack; more: allocated */

static SWITCH_HOT PyObject *BoundRun_vectorcall(BoundRun *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
	Py_ssize_t nargs = PyVectorcall_NARGS(nargsf), total = nargs + (kwnames ? PyTuple_GET_SIZE(kwnames) : 0);
	if (nargsf & PY_VECTORCALL_ARGUMENTS_OFFSET) { /* the caller lets args[-1] be borrowed */
		PyObject **slot = (PyObject **)args - 1, *saved = *slot;
		*slot = self->context;
		PyObject *result = ContextRun_vectorcall(self->run, slot, (size_t)(nargs + 1), kwnames);
		*slot = saved;
		return result;
	}
	PyObject *stack[BOUND_RUN_ARGS + 1], **all = stack;
	if (total >= BOUND_RUN_ARGS && (all = PyMem_Malloc((size_t)(total + 1) * sizeof(PyObject *))) == NULL)
		return PyErr_NoMemory();
	all[0] = self->context;
	memcpy(all + 1, args, (size_t)total * sizeof(PyObject *));
	PyObject *result = ContextRun_vectorcall(self->run, all, (size_t)(nargs + 1), kwnames);
	if (all != stack)
		PyMem_Free(all);
	return result;
}

static int BoundRun_traverse(BoundRun *self, visitproc visit, void *arg)
{
	Py_VISIT(self->run);
	Py_VISIT(self->context);
	return 0;
}

static int BoundRun_clear(BoundRun *self)
{
	Py_CLEAR(self->run);
	Py_CLEAR(self->context);
	return 0;
}

static SWITCH_HOT void BoundRun_dealloc(BoundRun *self)
{
	PyObject_GC_UnTrack(self);
	BoundRun_clear(self);
#ifndef Py_GIL_DISABLED
	Charges *tc = here.charges;
	if (tc != NULL && tc->spare_run == NULL && here.tstate == PyThreadState_Get()) {
		tc->spare_run = (PyObject *)self;
		return;
	}
#endif
	PyObject_GC_Del(self);
}

static PyMemberDef BoundRun_members[] = {
	{"__self__", T_OBJECT, offsetof(BoundRun, context), READONLY, "the context it runs in"},
	{"__func__", T_OBJECT, offsetof(BoundRun, run), READONLY, "Context.run's replacement"},
	{NULL},
};

static PyTypeObject BoundRunType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = SWITCH_HOOKS_MODULE ".BoundRun",
	.tp_basicsize = sizeof(BoundRun),
	.tp_dealloc = (destructor)BoundRun_dealloc,
	.tp_vectorcall_offset = offsetof(BoundRun, vectorcall),
	.tp_call = PyVectorcall_Call,
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
	.tp_doc = "ctx.run with a charge point on entering and leaving the context (otel_gil).",
	.tp_traverse = (traverseproc)BoundRun_traverse,
	.tp_clear = (inquiry)BoundRun_clear,
	.tp_members = BoundRun_members,
};

/* tp_descr_get of Context.run's replacement (Py_TPFLAGS_METHOD_DESCRIPTOR): bound to an
 * instance, itself on the class. */
static SWITCH_HOT PyObject *bind_context_run(PyObject *self, PyObject *obj, PyObject *type)
{
	if (obj == NULL || obj == Py_None) {
		Py_INCREF(self);
		return self;
	}
	BoundRun *bound = NULL;
#ifndef Py_GIL_DISABLED
	Charges *tc = here.charges;
	if (tc != NULL && tc->spare_run != NULL && here.tstate == PyThreadState_Get()) {
		bound = (BoundRun *)tc->spare_run;
		tc->spare_run = NULL;
		PyObject_Init((PyObject *)bound, &BoundRunType);
	}
#endif
	if (bound == NULL && (bound = PyObject_GC_New(BoundRun, &BoundRunType)) == NULL)
		return NULL;
	bound->vectorcall = (vectorcallfunc)BoundRun_vectorcall;
	Py_INCREF(self);
	bound->run = (ContextRun *)self;
	Py_INCREF(obj);
	bound->context = obj;
	PyObject_GC_Track(bound);
	return (PyObject *)bound;
}

static PyMemberDef ContextRun_members[] = {
	{"__wrapped__", T_OBJECT, offsetof(ContextRun, original), READONLY, "the Context.run this replaced"},
	{NULL},
};

static PyTypeObject ContextRunType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = SWITCH_HOOKS_MODULE ".ContextRun",
	.tp_basicsize = sizeof(ContextRun),
	.tp_dealloc = (destructor)ContextRun_dealloc,
	.tp_vectorcall_offset = offsetof(ContextRun, vectorcall),
	.tp_call = PyVectorcall_Call,
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_METHOD_DESCRIPTOR | Py_TPFLAGS_HAVE_VECTORCALL,
	.tp_doc = "run(callable, *args, **kwargs): contextvars.Context.run with a charge point on entering and "
		  "leaving the context (otel_gil: each span's own figures).",
	.tp_members = ContextRun_members,
	.tp_descr_get = bind_context_run,
};

static ContextRun *context_run; /* in Context's dict while hooked */

static PyObject *context_dict(void)
{
#if PY_3_12_OR_LATER
	return PyType_GetDict(&PyContext_Type); /* static builtin types keep theirs per interpreter */
#else
	Py_XINCREF(PyContext_Type.tp_dict);
	return PyContext_Type.tp_dict;
#endif
}

/* Put a ContextRun in Context.run's place (once); -1 with an error where there is none to replace. */
static SWITCH_UNUSED int hook_context_run(void)
{
	if (context_run != NULL)
		return 0;
	PyObject *dict = context_dict(), *original = NULL;
#if PY_3_13_OR_LATER
	if (dict != NULL && PyDict_GetItemRef(dict, s_switch_run, &original) < 0)
		PyErr_Clear();
#else
	original = dict ? PyDict_GetItemWithError(dict, s_switch_run) : NULL;
	Py_XINCREF(original);
#endif
	ContextRun *hook = original ? PyObject_New(ContextRun, &ContextRunType) : NULL;
	int failed = hook == NULL;
	if (!failed) {
		hook->vectorcall = (vectorcallfunc)ContextRun_vectorcall;
		hook->original = original;
		original = NULL;
		failed = PyDict_SetItem(dict, s_switch_run, (PyObject *)hook);
		if (failed)
			Py_DECREF(hook);
		else
			context_run = hook;
		PyType_Modified(&PyContext_Type);
	}
	if (failed && !PyErr_Occurred())
		PyErr_SetString(PyExc_RuntimeError, "contextvars.Context has no run method to hook");
	Py_XDECREF(original);
	Py_XDECREF(dict);
	return failed ? -1 : 0;
}

/* Put the original Context.run back (bound methods made from the hook still run the original). */
static SWITCH_UNUSED void unhook_context_run(void)
{
	if (context_run == NULL)
		return;
	PyObject *dict = context_dict();
	if (dict == NULL || PyDict_SetItem(dict, s_switch_run, context_run->original))
		PyErr_Clear();
	PyType_Modified(&PyContext_Type);
	Py_XDECREF(dict);
	Py_CLEAR(context_run);
}

/* ---------------------------------------------------------------- loops */

static PyObject *get_running_loop, *base_loop; /* asyncio's, once it is loaded (kept for good) */
static PyCFunction running_loop_c; /* ... its C function where it takes no arguments: called directly */

/* Before 3.14 only stdlib loops switch through Context.run: a span on a thread running any
 * other loop (uvloop, where SWITCH_LOOP_SEEN does not say otherwise) cannot be told from its
 * neighbours'. Whether a loop runs on the thread (1) or none (0: asyncio not loaded too). */
static SWITCH_UNUSED int check_loop(Charges *tc)
{
	if (__atomic_load_n(&base_loop, __ATOMIC_ACQUIRE) == NULL) {
		PyObject *events = PyImport_GetModule(s_switch_events), *base = PyImport_GetModule(s_switch_base_events);
		PyObject *getter = events ? PyObject_GetAttrString(events, "_get_running_loop") : NULL;
		PyObject *cls = base ? PyObject_GetAttrString(base, "BaseEventLoop") : NULL;
		Py_XDECREF(events);
		Py_XDECREF(base);
		PyErr_Clear();
		PyObject *none = NULL;
		if (getter == NULL || cls == NULL ||
		    !__atomic_compare_exchange_n(&get_running_loop, &none, getter, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
			Py_XDECREF(getter);
			Py_XDECREF(cls);
			return 0; /* not loaded (no loop), or another thread is setting them */
		}
		if (PyCFunction_Check(getter) && (PyCFunction_GetFlags(getter) & ~METH_COEXIST) == METH_NOARGS)
			running_loop_c = PyCFunction_GetFunction(getter);
		__atomic_store_n(&base_loop, cls, __ATOMIC_RELEASE);
	}
	PyObject *loop = running_loop_c ? running_loop_c(PyCFunction_GetSelf(get_running_loop), NULL)
				      : PyObject_CallNoArgs(get_running_loop);
	if (loop == NULL || loop == Py_None) {
		Py_XDECREF(loop);
		if (PyErr_Occurred())
			PyErr_Clear();
		return 0;
	}
	if (loop != tc->loop) {
		tc->loop_seen = PyObject_IsInstance(loop, base_loop) == 1 || SWITCH_LOOP_SEEN(loop);
		PyErr_Clear();
		Py_XSETREF(tc->loop, loop);
	} else {
		Py_DECREF(loop);
	}
	if (!tc->loop_seen && !tc->unseen) {
		tc->unseen = 1;
		flag_chain(tc->running, SWITCH_UNSEEN);
	}
	return 1;
}

/* ---------------------------------------------------------------- greenlets */

/* greenlet.settrace's callback for one thread: each switch is a charge point, then the
 * previous tracer (the app's), if any. */
typedef struct {
	PyObject_HEAD
	vectorcallfunc vectorcall;
	PyObject *previous;
} Tracer;

static SWITCH_HOT PyObject *Tracer_vectorcall(Tracer *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
	if (SWITCH_TRACKING) {
		Charges *tc = charges_here();
		if (tc != NULL)
			switched(tc, NULL, 1);
		PyErr_Clear(); /* a tracer error would turn the switch into a throw */
	}
	if (self->previous != NULL)
		return PyObject_Vectorcall(self->previous, args, nargsf, kwnames);
	Py_RETURN_NONE;
}

static void Tracer_dealloc(Tracer *self)
{
	Py_XDECREF(self->previous);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject TracerType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = SWITCH_HOOKS_MODULE ".GreenletTracer",
	.tp_basicsize = sizeof(Tracer),
	.tp_dealloc = (destructor)Tracer_dealloc,
	.tp_vectorcall_offset = offsetof(Tracer, vectorcall),
	.tp_call = PyVectorcall_Call,
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
	.tp_doc = "greenlet.settrace callback: every greenlet switch is a charge point (then the previous tracer).",
};

/* Trace the calling thread's greenlet switches once greenlet is loaded: its tracer into *tracer
 * (NULL until then). Looked for again only where sys.modules changed size since *modules. */
static void trace_greenlets(Py_ssize_t *modules, PyObject **tracer)
{
	PyObject *loaded = PyImport_GetModuleDict(), *greenlet = NULL;
	if (!PyDict_Check(loaded) || PyDict_GET_SIZE(loaded) == *modules)
		return;
	*modules = PyDict_GET_SIZE(loaded);
#if PY_3_13_OR_LATER
	if (PyDict_GetItemRef(loaded, s_switch_greenlet, &greenlet) <= 0) {
#else
	if ((greenlet = PyDict_GetItemWithError(loaded, s_switch_greenlet)) == NULL) {
#endif
		PyErr_Clear();
		return;
	}
#if !PY_3_13_OR_LATER
	Py_INCREF(greenlet);
#endif
	Tracer *made = PyObject_New(Tracer, &TracerType);
	if (made != NULL) {
		made->vectorcall = (vectorcallfunc)Tracer_vectorcall;
		made->previous = NULL;
		PyObject *previous = PyObject_CallMethodOneArg(greenlet, s_switch_settrace, (PyObject *)made);
		if (previous != NULL && previous != Py_None && !Py_IS_TYPE(previous, &TracerType))
			made->previous = previous;
		else
			Py_XDECREF(previous);
		if (previous != NULL)
			*tracer = (PyObject *)made;
		else
			Py_DECREF(made);
	}
	Py_DECREF(greenlet);
	PyErr_Clear();
}

/* At the module's init: the names and types above; -1 with an error. */
static int switch_hooks_init(void)
{
	if (s_switch_run != NULL) /* (a module executed again) */
		return 0;
	if ((s_switch_run = PyUnicode_InternFromString("run")) == NULL ||
	    (s_switch_settrace = PyUnicode_InternFromString("settrace")) == NULL ||
	    (s_switch_greenlet = PyUnicode_InternFromString("greenlet")) == NULL ||
	    (s_switch_events = PyUnicode_InternFromString("asyncio.events")) == NULL ||
	    (s_switch_base_events = PyUnicode_InternFromString("asyncio.base_events")) == NULL)
		return -1;
	return PyType_Ready(&ContextRunType) || PyType_Ready(&BoundRunType) || PyType_Ready(&TracerType);
}

#endif

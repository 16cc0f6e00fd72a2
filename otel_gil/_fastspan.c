/* The span hooks of otel_gil/spans.py in C, for the common case.
 *
 * A span that starts and ends on one thread of a registered process, with no
 * long wait in its window, gets its gil.* attributes here: one read of the
 * thread's slot at start, one at end, and the few values a calm span carries
 * (semconv.ALWAYS; the counters where not 0) into the span's attribute dict, in
 * one pass. Everything else (no ring yet, another thread ended the span, long waits
 * to turn into events, a back-dated start, an SDK whose internals differ) is
 * handed to the Python hooks, which stay the reference: spans.py documents the
 * figures, and tests/unit/test_spans.py runs every case through both.
 *
 * The slot layout is otel_gil/gil_layout.h, the same file the BPF side uses.
 */
#include "fastspan.h"
#include "span_figures.h"
#include "long_waits.h"

#include <pthread.h>
#include <structmember.h>

/* fork()s this process came out of, whoever called fork (os.fork, or C code such as
 * uWSGI's, where Python's at-fork hooks never run): a child's cached tids expire, and
 * the hooks ask the backend to check its pid (registration.check_fork()). */
unsigned long forks;

static void count_fork(void) { forks++; }

/* initial-exec (here, in thread_names.c and context_switches.c too): a fixed offset from the
 * thread pointer, no __tls_get_addr call per access (~90 bytes of glibc's static TLS reserve). */
__thread __attribute__((tls_model("initial-exec"))) struct thread_slot tls = {NULL, -1, 0, 0, -1};

/* Interned attribute names and attribute keys, made when the module loads. */
PyObject *s_start_attr, *s_active, *s_private_name, *s_public_name, *s_thread_key;
static PyObject *s_state, *s_ring, *s_generation, *s_status, *s_address, *s_nslots, *s_long_wait_ns,
	*s_start_time, *s_end_time, *s_attributes, *s_dict, *s_immutable, *s_max_value_len, *s_maxlen,
	*s_kind, *s_set_attributes, *s_end_time_kw, *s_span_processor, *s_start, *s_lock, *s_locked, *s_wrapped;
static PyTypeObject *lock_type; /* threading.Lock's */
static PyObject *lock_locked; /* its locked() */
static PyObject *k_thread_name, *k_thread_id, *k_wait_ms, *k_hold_ms, *k_wait_ratio, *k_hold_ratio,
	*k_acquisitions, *k_convoy_waits, *k_others_hold_ms, *k_http_route;
static PyObject *zero; /* 0.0, the value of most calm spans' wait figures: one float for all */

PyObject *float_value(double v)
{
	if (v == 0.0) {
		Py_INCREF(zero);
		return zero;
	}
	return PyFloat_FromDouble(v);
}

/* ---------------------------------------------------------------- Start */

/* Starts kept for the next spans (as CPython keeps floats): a span's Start without the allocator. */
#define FREE_STARTS 32
static Start *free_starts[FREE_STARTS];
static int nfree_starts;

static void Start_dealloc(Start *self)
{
	Py_XDECREF(self->name);
	Py_XDECREF(self->parent);
	Py_XDECREF(self->prev_running);
	Py_XDECREF(self->registration);
	Py_XDECREF(self->ring);
	Py_XDECREF(self->metrics);
	Py_XDECREF(self->status);
	if (nfree_starts < FREE_STARTS)
		free_starts[nfree_starts++] = self;
	else
		Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A new Start, its fields unset. */
static Start *new_start(void)
{
	if (nfree_starts == 0)
		return PyObject_New(Start, &StartType);
	return (Start *)PyObject_Init((PyObject *)free_starts[--nfree_starts], &StartType);
}

static PyObject *Start_counters(Start *self, void *closure)
{
	const struct counters *c = &self->counters;
	return Py_BuildValue("(KKKKK)", (unsigned long long)c->wait_ns, (unsigned long long)c->hold_ns,
			     (unsigned long long)c->acquisitions, (unsigned long long)c->convoy_waits,
			     (unsigned long long)c->long_waits);
}

/* Start.own: what the span's own code did (context_switches.c). Its fields are spans.Own's,
 * by name (tests/unit/test_native_contract.py checks both sides). */
static PyStructSequence_Field own_fields[] = {
	{"hold_home", "ns the GIL was held by its code on its home thread"},
	{"acquisitions_home", "GIL acquisitions by its code on its home thread"},
	{"wait_else", "ns its code waited on other threads"},
	{"hold_else", "ns its code held the GIL on other threads"},
	{"acquisitions_else", "GIL acquisitions by its code on other threads"},
	{"convoy_else", "convoy waits of its code on other threads"},
	{"threads_else", "other threads its code ran on, -1: more than 8"},
	{"switched", "its home thread switched contexts while it ran"},
	{"unseen", "a switch no hook saw changed whose code ran on a thread it ran on"},
	{"broken", "a thread's counters went back between two charges"},
	{"untracked", "otel-gil was uninstrumented for a while since it started"},
	{NULL},
};

static PyStructSequence_Desc own_desc = {
	"otel_gil._fastspan.Own",
	"What a span's own code did on the GIL (spans.Own).",
	own_fields,
	sizeof(own_fields) / sizeof(own_fields[0]) - 1,
};

static PyTypeObject OwnType;

/* The span's Own; None where contexts are not tracked. */
static PyObject *Start_own(Start *self, void *closure)
{
	if (!self->tracked)
		Py_RETURN_NONE;
	const struct own *o = &self->own;
	PyObject *own = PyStructSequence_New(&OwnType);
	if (own == NULL)
		return NULL;
	PyObject *values[] = {
		PyLong_FromUnsignedLongLong(o->hold_home),
		PyLong_FromUnsignedLongLong(o->acquisitions_home),
		PyLong_FromUnsignedLongLong(o->wait_else),
		PyLong_FromUnsignedLongLong(o->hold_else),
		PyLong_FromUnsignedLongLong(o->acquisitions_else),
		PyLong_FromUnsignedLongLong(o->convoy_else),
		PyLong_FromLong(o->threads_else == OWN_MANY ? -1 : (long)o->threads_else),
		PyBool_FromLong(self->switched),
		PyBool_FromLong((o->flags & OWN_UNSEEN) != 0),
		PyBool_FromLong((o->flags & OWN_BROKEN) != 0),
		PyBool_FromLong(!tracked_throughout(self)),
	};
	int failed = 0;
	for (Py_ssize_t i = 0; i < (Py_ssize_t)(sizeof(values) / sizeof(values[0])); i++) {
		failed |= values[i] == NULL;
		PyStructSequence_SET_ITEM(own, i, values[i]);
	}
	if (failed)
		Py_CLEAR(own);
	return own;
}

static PyMemberDef Start_members[] = {
	{"registration", T_OBJECT, offsetof(Start, registration), READONLY, NULL},
	{"ring", T_OBJECT, offsetof(Start, ring), READONLY, NULL},
	{"metrics", T_OBJECT, offsetof(Start, metrics), READONLY, NULL},
	{"status", T_OBJECT, offsetof(Start, status), READONLY, NULL},
	{"generation", T_LONG, offsetof(Start, generation), READONLY, NULL},
	{"tid", T_LONG, offsetof(Start, tid), READONLY, NULL},
	{"mono_ns", T_LONGLONG, offsetof(Start, mono_ns), READONLY, NULL},
	{"wall_ns", T_LONGLONG, offsetof(Start, wall_ns), READONLY, NULL},
	{NULL},
};

static PyGetSetDef Start_getset[] = {
	{"counters", (getter)Start_counters, NULL, "(wait_ns, hold_ns, acquisitions, convoy_waits, long_waits)", NULL},
	{"own", (getter)Start_own, NULL, "what the span's own code did on the GIL (Own), None where contexts are not tracked",
	 NULL},
	{NULL},
};

PyTypeObject StartType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "otel_gil._fastspan.Start",
	.tp_basicsize = sizeof(Start),
	.tp_dealloc = (destructor)Start_dealloc,
	.tp_flags = Py_TPFLAGS_DEFAULT,
	.tp_doc = "GIL counters of a thread when a span started (read by the C and Python hooks alike).",
	.tp_members = Start_members,
	.tp_getset = Start_getset,
};

/* ---------------------------------------------------------------- Hooks */

static int Hooks_traverse(Hooks *self, visitproc visit, void *arg)
{
	Py_VISIT(self->registration);
	Py_VISIT(self->metrics);
	Py_VISIT(self->py_on_start);
	Py_VISIT(self->py_end);
	Py_VISIT(self->py_server);
	Py_VISIT(self->server_kind);
	Py_VISIT(self->ratios);
	return 0;
}

static int Hooks_clear(Hooks *self)
{
	Py_CLEAR(self->registration);
	Py_CLEAR(self->metrics);
	Py_CLEAR(self->ok);
	Py_CLEAR(self->py_on_start);
	Py_CLEAR(self->py_end);
	Py_CLEAR(self->py_server);
	Py_CLEAR(self->server_kind);
	Py_CLEAR(self->ratios);
	Py_CLEAR(self->threading);
	Py_CLEAR(self->state);
	Py_CLEAR(self->ring);
	return 0;
}

static void Hooks_dealloc(Hooks *self)
{
	PyObject_GC_UnTrack(self);
	Hooks_clear(self);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Hooks_init(Hooks *self, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = {"registration", "metrics", "ok", "on_start", "end", "server", "server_kind", "every",
				 NULL};
	PyObject *registration, *metrics, *ok, *on_start, *end, *server, *server_kind;
	int every = 0;
	if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOUOOOO|p", kwlist, &registration, &metrics, &ok, &on_start, &end,
					 &server, &server_kind, &every))
		return -1;
	PyObject *threading = PyImport_ImportModule("threading");
	if (threading == NULL)
		return -1;
	Hooks_clear(self);
	Py_INCREF(registration), self->registration = registration;
	Py_INCREF(metrics), self->metrics = metrics;
	Py_INCREF(ok), self->ok = ok;
	Py_INCREF(on_start), self->py_on_start = on_start;
	Py_INCREF(end), self->py_end = end;
	Py_INCREF(server), self->py_server = server;
	Py_INCREF(server_kind), self->server_kind = server_kind;
	self->threading = threading;
	if (metrics != Py_None) { /* GilMetrics.ratios.counter: count server spans here, without Python */
		PyObject *ratios = PyObject_GetAttrString(metrics, "ratios");
		PyObject *counter = ratios ? PyObject_GetAttrString(ratios, "counter") : NULL;
		Py_XDECREF(ratios);
		clear_error();
		if (counter != NULL && Py_IS_TYPE(counter, &RatioCounterType))
			self->ratios = (RatioCounter *)counter;
		else
			Py_XDECREF(counter);
	}
	self->seen_forks = forks;
	self->enabled = 1;
	self->every = every;
	return 0;
}

/* The registration's ring if the process is registered (a new reference), else NULL
 * with no error set. Caches the ring's address and size on first sight. Ring, status and
 * generation come from one read of registration.state (client.State), so they agree. */
static PyObject *current_ring(Hooks *self, long *generation)
{
	PyObject *state = LOOKUP(self->registration, s_state);
	if (state == NULL)
		return NULL;
	if (state == self->state) { /* a State never changes: as registered, with that ring, as when last read */
		Py_DECREF(state);
		*generation = self->generation;
		Py_INCREF(self->ring);
		return self->ring;
	}
	PyObject *status = PyObject_GetAttr(state, s_status);
	int ok = status != NULL && (status == self->ok || PyUnicode_Compare(status, self->ok) == 0);
	Py_XDECREF(status);
	PyObject *gen = ok && !PyErr_Occurred() ? PyObject_GetAttr(state, s_generation) : NULL;
	PyObject *ring = gen != NULL ? PyObject_GetAttr(state, s_ring) : NULL;
	Py_CLEAR(self->state);
	if (gen == NULL) {
		Py_DECREF(state);
		return NULL;
	}
	*generation = PyLong_AsLong(gen);
	Py_DECREF(gen);
	self->generation = *generation;
	if (ring == NULL || ring == Py_None || PyErr_Occurred()) {
		Py_DECREF(state);
		Py_XDECREF(ring);
		return NULL;
	}
	if (ring != self->ring) {
		PyObject *address = PyObject_GetAttr(ring, s_address);
		PyObject *nslots = address ? PyObject_GetAttr(ring, s_nslots) : NULL;
		PyObject *long_wait = nslots ? PyObject_GetAttr(ring, s_long_wait_ns) : NULL;
		if (long_wait != NULL) {
			self->base = (const char *)PyLong_AsVoidPtr(address);
			self->nslots = (uint32_t)PyLong_AsUnsignedLong(nslots);
			self->long_wait_ns = PyLong_AsUnsignedLongLong(long_wait);
		}
		Py_XDECREF(address);
		Py_XDECREF(nslots);
		Py_XDECREF(long_wait);
		if (long_wait == NULL || PyErr_Occurred() || self->nslots == 0) {
			Py_CLEAR(self->ring);
			Py_DECREF(state);
			Py_DECREF(ring);
			return NULL;
		}
		Py_INCREF(ring);
		Py_XSETREF(self->ring, ring);
	}
	self->state = state; /* takes the reference */
	return ring;
}

/* CLOCK_REALTIME minus CLOCK_MONOTONIC as read at `at` (CLOCK_MONOTONIC; 0: never). NTP's slewing
 * moves both clocks alike: the difference changes only where the wall clock is set (a step), so
 * a second's old one stands for a read of the wall clock (~20 ns less at a span's start, as much
 * at its end). */
static struct {
	long long offset, at;
} wall_minus_mono;
#define WALL_MINUS_MONO_FOR 1000000000LL

/* The wall clock at `mono` (CLOCK_MONOTONIC, just read). */
static long long wall_at(long long mono)
{
	if (wall_minus_mono.at == 0 || mono - wall_minus_mono.at > WALL_MINUS_MONO_FOR || mono < wall_minus_mono.at) {
		wall_minus_mono.offset = (long long)clock_ns(CLOCK_REALTIME) - mono;
		wall_minus_mono.at = mono;
	}
	return mono + wall_minus_mono.offset;
}

/* The Python hook's snapshot, where the C one cannot be taken (it says why, or logs the error once). */
static COLD PyObject *python_start(Hooks *self, PyObject *span)
{
	clear_error();
	return PyObject_CallOneArg(self->py_on_start, span);
}

/* The thread's counters onto the span as its start snapshot (None, or NULL on an error). */
static PyObject *snapshot_onto(Hooks *self, PyObject *span, PyThreadState *ts)
{
	if (!self->enabled)
		Py_RETURN_NONE;
	if (self->seen_forks != forks) { /* a child: the backend re-registers or restarts its ring for this pid */
		self->seen_forks = forks;
		PyObject *checked = PyObject_CallMethod(self->registration, "check_fork", NULL);
		Py_XDECREF(checked);
		clear_error();
	}
	long generation;
	PyObject *ring = tracking_contexts(self) ? current_ring(self, &generation) : NULL;
	if (ring == NULL) /* not registered, or contexts not followed: the Python hook says why */
		return python_start(self, span);
	Start *start = new_start();
	if (start == NULL) {
		Py_DECREF(ring);
		return python_start(self, span);
	}
	thread_for(self->registration, generation);
	start->mono_ns = (long long)clock_ns(CLOCK_MONOTONIC);
	start->wall_ns = wall_at(start->mono_ns);
	read_counters(self->base, self->nslots, (uint64_t)start->mono_ns, &start->counters);
	Py_INCREF(self->registration), start->registration = self->registration;
	start->ring = ring;
	Py_INCREF(self->metrics), start->metrics = self->metrics;
	Py_INCREF(self->ok), start->status = self->ok;
	start->base = self->base;
	start->nslots = self->nslots;
	start->long_wait_ns = self->long_wait_ns;
	start->generation = generation;
	start->tid = tls.tid;
	start->tracked = start->switched = 0;
	start->switches = start->span_id = 0;
	start->home_tid = 0;
	start->name = NULL;
	start->parent = start->prev_running = NULL;
	memset(&start->own, 0, sizeof(start->own));
	int failed = store_attr(span, s_start_attr, (PyObject *)start);
	if (!failed)
		context_start(self, start, span, ts);
	Py_DECREF(start);
	if (failed) /* the Python hook meets the same failure and logs it, once: never break the app */
		return python_start(self, span);
	Py_RETURN_NONE;
}

/* Whether lock (span._lock, or NULL) is a threading.Lock nobody holds. With the GIL held and no Python code
 * run until the caller is done, that is holding it: a thread that takes it now (one blocked
 * on it takes it without the GIL) runs no code under it before the GIL comes back. The
 * span's attribute dict is written under that lock only (exporters and span.attributes see
 * a read-only view), so its own lock is free then. */
static int is_free(PyObject *lock /* or NULL */)
{
	PyObject *locked = NULL;
	int state = lock != NULL ? lock_state(lock) : -1; /* (cpython_layouts.c: in place) */
	if (state < 0 && lock != NULL && Py_IS_TYPE(lock, lock_type))
		locked = PyObject_Vectorcall(lock_locked, &lock, 1, NULL);
	Py_XDECREF(locked);
	return state == 0 || locked == Py_False;
}

int lock_free(PyObject *obj)
{
	PyObject *lock = LOOKUP(obj, s_lock);
	int free = is_free(lock);
	Py_XDECREF(lock);
	return free;
}

/* The span's attribute dict (a new reference) if our values may go straight in, as
 * set_attributes would leave them: the span not ended, its attributes mutable, no value
 * length limit, room for them, and nobody in the span's lock. Else NULL. */
static PyObject *direct_dict(PyObject *span, Py_ssize_t adding, PyThreadState *ts)
{
	PyObject *sf[3], *bf[4] = {NULL, NULL, NULL, NULL}; /* the span's, its BoundedAttributes': */
	enum { ATTRIBUTES, END, LOCK };
	enum { DICT, IMMUTABLE, MAX_VALUE_LEN, MAXLEN };
	FIELDS(span, sf, s_attributes, s_end_time, s_lock);
	if (sf[ATTRIBUTES] != NULL)
		FIELDS(sf[ATTRIBUTES], bf, s_dict, s_immutable, s_max_value_len, s_maxlen);
	PyObject *d = bf[DICT], *maxlen = bf[MAXLEN];
	int usable = sf[END] == Py_None && d != NULL && PyDict_CheckExact(d) && bf[IMMUTABLE] == Py_False &&
		     bf[MAX_VALUE_LEN] == Py_None && maxlen != NULL;
	if (usable && maxlen != Py_None) {
		Py_ssize_t limit = PyLong_AsSsize_t(maxlen);
		usable = !error_in(ts) && PyDict_GET_SIZE(d) + adding <= limit;
	}
	usable = usable && is_free(sf[LOCK]);
	for (int i = ATTRIBUTES; i <= LOCK; i++)
		Py_XDECREF(sf[i]);
	for (int i = IMMUTABLE; i <= MAXLEN; i++)
		Py_XDECREF(bf[i]);
	clear_error_in(ts);
	if (!usable)
		Py_CLEAR(d);
	return d;
}

/* span.set_attributes({keys[i]: values[i]}): 0, or -1 with an error set. */
static COLD int set_attributes_call(PyObject *span, PyObject *const *keys, PyObject *const *values, Py_ssize_t n)
{
	PyObject *attrs = PyDict_New();
	if (attrs == NULL)
		return -1;
	for (Py_ssize_t i = 0; i < n; i++)
		if (PyDict_SetItem(attrs, keys[i], values[i])) {
			Py_DECREF(attrs);
			return -1;
		}
	PyObject *r = PyObject_CallMethodOneArg(span, s_set_attributes, attrs);
	Py_DECREF(attrs);
	Py_XDECREF(r);
	return r ? 0 : -1;
}

/* dict_fill_empty's models, one per set of keys fast_figures sets (a bit per key not always
 * there: others_hold_ms, hold_ratio, acquisitions, convoy_waits; a long wait's), made at import. */
#define KEY_SETS 32
static PyObject *key_sets[KEY_SETS];

/* Set the values on the span in one pass: straight into its attribute dict (then *used is
 * that dict, a new reference), or through set_attributes (its lock held, or a limit to apply).
 *
 * The direct path leaves what set_attributes would (a key already there moves to the end),
 * minus its cleaning of values that are already clean (str keys, float and int values,
 * a thread name). From the checks of direct_dict to the last insert it runs no Python
 * code and allocates nothing the cyclic GC tracks, so it keeps the GIL throughout. */
static int set_attributes(PyObject *span, unsigned which, PyObject *const *keys, PyObject *const *values,
			  Py_ssize_t n, PyObject **used, PyThreadState *ts)
{
	PyObject *dict = direct_dict(span, n, ts);
	if (dict != NULL) {
		int rc = PyDict_GET_SIZE(dict) ? 0 : dict_fill_empty(dict, key_sets[which], keys, values, n);
		for (Py_ssize_t i = 0; i < n && rc == 0; i++) { /* (1: filled) */
			Py_ssize_t size = PyDict_GET_SIZE(dict);
			rc = PyDict_SetItem(dict, keys[i], values[i]);
			if (rc == 0 && PyDict_GET_SIZE(dict) == size) /* it was there: to the end, as set_attributes */
				rc = PyDict_DelItem(dict, keys[i]) || PyDict_SetItem(dict, keys[i], values[i]);
		}
		if (rc >= 0) {
			*used = dict;
			return 0;
		}
		Py_DECREF(dict);
		return -1;
	}
	return set_attributes_call(span, keys, values, n);
}

/* Whether the registration still has the ring the span started with. */
static int same_ring(Hooks *self, Start *start)
{
	PyObject *state = LOOKUP(start->registration, s_state);
	if (state == NULL)
		return -1;
	if (state == self->state) { /* unchanged since current_ring last read it */
		Py_DECREF(state);
		return self->ring == start->ring;
	}
	PyObject *ring = PyObject_GetAttr(state, s_ring);
	Py_DECREF(state);
	Py_XDECREF(ring);
	return ring == NULL ? -1 : ring == start->ring;
}

#define MAX_KEYS (9 + LONG_WAIT_KEYS)

/* The figures of a span that needs nothing but its counters; 1 when set, 0 when the Python hook must do it.
 * Which it carries: semconv.ALWAYS, WHEN_NONZERO where not 0, EVERY_ONLY (as spans.carried). */
static int fast_figures(Hooks *self, Start *start, PyObject *span, long long span_start, long long span_end,
			uint64_t now, double *wait_ratio, PyObject **attributes, PyThreadState *ts)
{
	int same = same_ring(self, start);
	if (same <= 0)
		return same; /* the collector restarted, or the process forked, meanwhile */
	thread_for(start->registration, start->generation);
	if (tls.tid != start->tid)
		return 0; /* ended on another thread */
	struct counters end;
	read_counters(start->base, start->nslots, now, &end);
	/* A back-dated start (Flask's server span, from the WSGI call): spans.figures takes the ring's
	 * long waits from its start on, those from before the span object existed too. Here only
	 * where there are none of those (the last one before the span's own started before). */
	long long gap = start->wall_ns - span_start;
	uint64_t before = start->counters.long_waits; /* the waits the span's own come after */
	if (gap >= (long long)start->long_wait_ns && before) {
		if (tls.index < 0 || end.long_waits < before)
			return 0;
		const volatile struct gil_long_wait *last = &slot_at(start->base, tls.index)->ring[(before - 1) % GIL_RING_LEN];
		if ((long long)(end.long_waits == before ? last->end_ns : last->start_ns) > start->mono_ns - gap)
			return 0;
	}
	long long duration = span_end - span_start;
	if ((long long)(now - start->mono_ns) > duration)
		duration = (long long)(now - start->mono_ns);
	if (duration < 1)
		duration = 1;
	const struct own *o = start->tracked ? &start->own : NULL;
	int untracked = o && (start->switched || o->threads_else) && !tracked_throughout(start);
	struct figures f;
	if (!span_figures(&start->counters, &end, o, start->switched, untracked, duration, &f))
		return 0;
	struct long_waits lw = {0}; /* its events: one long wait here (long_waits.c), the rest in Python */
	if (end.long_waits != start->counters.long_waits && !long_waits_read(start, span, now, &end, &lw))
		return 0;
	*wait_ratio = (double)f.wait / (double)duration;
	PyObject *keys[MAX_KEYS], *values[MAX_KEYS];
	PyObject *ident = NULL; /* thread.id: the managed id, as spans.py */
	PyObject *name = thread_name(self->threading, &ident, ts);
	int n = 0, every = self->every, failed = 0;
	unsigned which = 0; /* key_sets' bits */
#define PUT(key, value) (keys[n] = (key), failed |= (values[n++] = (value)) == NULL)
	PUT(k_thread_name, name);
	PUT(k_thread_id, ident);
	for (int i = 0; i < lw.n; i++, which |= 16)
		Py_INCREF(lw.values[i]), PUT(lw.keys[i], lw.values[i]);
	if (start->tracked && start->switched && (every || f.others))
		PUT(k_others_hold_ms, float_value((double)f.others / 1e6)), which |= 1;
	PUT(k_wait_ms, float_value((double)f.wait / 1e6));
	PUT(k_hold_ms, float_value((double)f.hold / 1e6));
	PUT(k_wait_ratio, float_value(*wait_ratio));
	if (every)
		PUT(k_hold_ratio, float_value((double)f.hold / (double)duration)), which |= 2;
	if (every || f.acquisitions)
		PUT(k_acquisitions, PyLong_FromUnsignedLongLong(f.acquisitions)), which |= 4;
	if (every || f.convoy)
		PUT(k_convoy_waits, PyLong_FromUnsignedLongLong(f.convoy)), which |= 8;
#undef PUT
	int rc = failed ? -1 : set_attributes(span, which, keys, values, n, attributes, ts) ? -1 : 1;
	for (int i = 0; i < n; i++)
		Py_XDECREF(values[i]);
	if (rc == 1) /* (the direct path checked the span: nothing ran since) */
		long_waits_commit(&lw, span, *attributes != NULL);
	long_waits_clear(&lw);
	return rc;
}

static long long as_ns(PyObject *value, int *ok)
{
	*ok = 0;
	return value ? long_value(value, ok) : -1; /* LP64: as wide as long long */
}

/* ---------------------------------------------------------------- SpanMethod */

/* Takes Span.start's or Span.end's place in the class: a method descriptor, so
 * `span.end()` calls it with the span as first argument and no bound-method object
 * in between. */
typedef struct {
	PyObject_HEAD
	Hooks *hooks;
	PyObject *original; /* the Span method it replaced */
	PyObject *scope;    /* start: the span processor of the provider whose spans get figures */
	vectorcallfunc vectorcall;
} SpanMethod;

/* The Python hook, with wrapt's signature: (bound original, span, args, kwargs). */
static COLD PyObject *python_end(SpanMethod *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
	PyObject *bound = PyMethod_New(self->original, args[0]);
	PyObject *rest = bound ? PyTuple_New(nargs - 1) : NULL;
	for (Py_ssize_t i = 1; rest && i < nargs; i++) {
		Py_INCREF(args[i]);
		PyTuple_SET_ITEM(rest, i - 1, args[i]);
	}
	PyObject *kwargs = rest ? PyDict_New() : NULL;
	PyObject *result = NULL;
	int failed = kwargs == NULL;
	for (Py_ssize_t i = 0; !failed && kwnames && i < PyTuple_GET_SIZE(kwnames); i++)
		failed = PyDict_SetItem(kwargs, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]);
	if (!failed)
		result = PyObject_CallFunctionObjArgs(self->hooks->py_end, bound, args[0], rest, kwargs, NULL);
	Py_XDECREF(bound);
	Py_XDECREF(rest);
	Py_XDECREF(kwargs);
	return result;
}

/* A server span's wait ratio into the metrics' counter, by http.route (else the span's
 * name), as spans.record_server_span does; 0, or -1 for that function to do it.
 * attributes: the span's attribute dict, where fast_figures wrote into it (else NULL:
 * the figures went through set_attributes, and record_server_span reads the route). */
static int count_server_span(Hooks *hooks, PyObject *span, PyObject *attributes, double wait_ratio)
{
	if (hooks->ratios == NULL || attributes == NULL)
		return -1;
	PyObject *route = PyDict_GetItemWithError(attributes, k_http_route);
	Py_XINCREF(route);
	if (route == NULL || !PyObject_IsTrue(route)) {
		Py_XDECREF(route);
		route = LOOKUP(span, s_private_name);
	}
	int failed = route == NULL || !PyUnicode_CheckExact(route) || count_ratio(hooks->ratios, route, wait_ratio);
	Py_XDECREF(route);
	return failed ? -1 : 0;
}

/* The replaced method called (args: its own), through its vectorcall where it has one: PyObject_Vectorcall
 * looks the thread state up first, only to check the result (from 3.12 a call into libpython's
 * thread-local storage). */
static inline PyObject *call_original(SpanMethod *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
	vectorcallfunc call = PyVectorcall_Function(self->original);
	return call ? call(self->original, args, nargsf, kwnames) : PyObject_Vectorcall(self->original, args, nargsf, kwnames);
}

/* Whether `method` is `ours` or wraps it (its chain of __wrapped__, as far as WRAPS_DEPTH). */
#define WRAPS_DEPTH 16
static COLD int wraps(PyObject *method, PyObject *ours)
{
	Py_INCREF(method);
	for (int depth = 0; method != NULL && depth < WRAPS_DEPTH; depth++) {
		if (method == ours) {
			Py_DECREF(method);
			return 1;
		}
		Py_SETREF(method, lookup(method, s_wrapped));
	}
	Py_XDECREF(method);
	clear_error();
	return 0;
}

/* span.end(end_time=None): the gil.* figures, then the original end. */
static PyObject *end_vectorcall(SpanMethod *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
	if (!self->hooks->enabled) /* left under another library's wrapper by unwrap_span (or shut down) */
		return call_original(self, args, nargsf, kwnames);
	Py_ssize_t nargs = PyVectorcall_NARGS(nargsf), nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
	if (nargs < 1) {
		PyErr_SetString(PyExc_TypeError, "Span.end() needs the span");
		return NULL;
	}
	PyObject *span = args[0];
	PyObject *f[5]; /* the span's: */
	enum { START, END_TIME, START_TIME, NAME, KIND };
	FIELDS(span, f, s_start_attr, s_end_time, s_start_time, s_private_name, s_kind);
	PyObject *start = f[START];
	if (start == NULL || !PyObject_TypeCheck(start, &StartType)) {
		for (int i = 1; i < 5; i++)
			Py_XDECREF(f[i]);
		clear_error();
		if (start == NULL) /* not a span of a provider with otel-gil */
			return call_original(self, args, nargsf, kwnames);
		Py_DECREF(start); /* started by the Python hook */
		return python_end(self, args, nargs, kwnames);
	}
	Start *st = (Start *)start;
	PyThreadState *ts = PyThreadState_Get(); /* (looked up once: clear_error_in) */
	PyObject *explicit = NULL;
	int plain = nargs + nkw == 1;
	if (nargs + nkw == 2 && (nkw == 0 || PyUnicode_Compare(PyTuple_GET_ITEM(kwnames, 0), s_end_time_kw) == 0))
		explicit = args[1];
	int ok_start;
	long long span_start = as_ns(f[START_TIME], &ok_start);
	int simple = f[END_TIME] == Py_None && ok_start && (plain || explicit == Py_None);
	uint64_t now = 0; /* the figures' instant: the last charge's, where there is one */
	if (f[END_TIME] == Py_None && st->tracked)
		now = context_end(st, f[NAME], ts); /* what ran since the last charge point is its own: before any figure is read */
	Py_XDECREF(f[END_TIME]);
	Py_XDECREF(f[START_TIME]);
	Py_XDECREF(f[NAME]);
	PyObject *kind = f[KIND];
	clear_error_in(ts);
	if (!simple) { /* ended already, an explicit end time (rare: checked against the slot there), odd
	                * arguments, an SDK we do not know: the Python hook decides */
		Py_XDECREF(kind);
		Py_DECREF(start);
		return python_end(self, args, nargs, kwnames);
	}
	if (now == 0)
		now = clock_ns(CLOCK_MONOTONIC);
	long long end_ns = wall_at((long long)now);
	Hooks *hooks = self->hooks;
	double wait_ratio;
	PyObject *attributes = NULL;
	int done = fast_figures(hooks, st, span, span_start, end_ns, now, &wait_ratio, &attributes, ts);
	if (done <= 0) { /* the Python hook's case; on an error it logs it once: never break the app */
		clear_error_in(ts);
		Py_XDECREF(kind);
		Py_DECREF(start);
		return python_end(self, args, nargs, kwnames);
	}
	if (st->metrics != Py_None) {
		if (kind == hooks->server_kind && count_server_span(hooks, span, attributes, wait_ratio) != 0) {
			clear_error_in(ts); /* anything unusual: record_server_span decides, and logs its own failures */
			PyObject *ratio = PyFloat_FromDouble(wait_ratio);
			PyObject *r = ratio ? PyObject_CallFunctionObjArgs(hooks->py_server, start, span, ratio, NULL) : NULL;
			Py_XDECREF(r);
			Py_XDECREF(ratio);
		}
		clear_error_in(ts);
	}
	Py_XDECREF(kind);
	Py_XDECREF(attributes);
	Py_DECREF(start);
	PyObject *call[2] = {span, long_from(end_ns)};
	if (call[1] == NULL)
		return NULL;
	/* end(self, end_time) by position: no keyword for the callee to match */
	PyObject *result = call_original(self, call, 2, NULL);
	Py_DECREF(call[1]);
	return result;
}

/* span.start(start_time=None, parent_context=None): the original start (it calls every span
 * processor's on_start), then the snapshot, for the spans of the hooked provider only.
 * In place of a span processor: the SDK's call of one more processor costs more than the snapshot. */
static PyObject *start_vectorcall(SpanMethod *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
	if (!self->hooks->enabled && PyVectorcall_NARGS(nargsf) >= 1) {
		/* Looked up before an uninstrument() (the thread lost the GIL in between): the
		 * class's start now, the original or a newer hook, decides. A start in flight
		 * across an uninstrument() and instrument() keeps its snapshot. Where this stays
		 * under another library's wrapper (unwrap_span could not take it out), it passes through. */
		PyObject *current = PyObject_GetAttr((PyObject *)Py_TYPE(args[0]), s_start);
		if (current == NULL)
			clear_error();
		else if (!wraps(current, (PyObject *)self)) {
			PyObject *result = PyObject_Vectorcall(current, args, nargsf, kwnames);
			Py_DECREF(current);
			return result;
		}
		Py_XDECREF(current);
	}
	PyObject *result = call_original(self, args, nargsf, kwnames);
	if (result == NULL || PyVectorcall_NARGS(nargsf) < 1 || !self->hooks->enabled)
		return result;
	PyObject *span = args[0], *f[2]; /* its processor, its Start */
	PyThreadState *ts = PyThreadState_Get(); /* (looked up once: clear_error_in) */
	FIELDS(span, f, s_span_processor, s_start_attr);
	Py_XDECREF(f[0]);
	if (f[0] == self->scope && f[1] == NULL) { /* not a repeated start() */
		PyObject *r = snapshot_onto(self->hooks, span, ts);
		Py_XDECREF(r);
	}
	Py_XDECREF(f[1]);
	clear_error_in(ts); /* the snapshot's failures are logged by the Python hook: never break the app */
	return result;
}

static int SpanMethod_traverse(SpanMethod *self, visitproc visit, void *arg)
{
	Py_VISIT(self->hooks);
	Py_VISIT(self->original);
	Py_VISIT(self->scope);
	return 0;
}

static int SpanMethod_clear(SpanMethod *self)
{
	Py_CLEAR(self->hooks);
	Py_CLEAR(self->original);
	Py_CLEAR(self->scope);
	return 0;
}

static void SpanMethod_dealloc(SpanMethod *self)
{
	PyObject_GC_UnTrack(self);
	SpanMethod_clear(self);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef SpanMethod_members[] = {
	{"__wrapped__", T_OBJECT, offsetof(SpanMethod, original), READONLY, "the Span method this replaced"},
	{NULL},
};

/* The replaced method's __name__ and __qualname__ (closure: the name), as another library's wrapper may read them. */
static PyObject *SpanMethod_original_name(SpanMethod *self, void *closure)
{
	return PyObject_GetAttrString(self->original, (const char *)closure);
}

static PyGetSetDef SpanMethod_getset[] = {
	{"__name__", (getter)SpanMethod_original_name, NULL, "the replaced method's", "__name__"},
	{"__qualname__", (getter)SpanMethod_original_name, NULL, "the replaced method's", "__qualname__"},
	{NULL},
};

static PyTypeObject SpanMethodType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "otel_gil._fastspan.SpanMethod",
	.tp_basicsize = sizeof(SpanMethod),
	.tp_dealloc = (destructor)SpanMethod_dealloc,
	.tp_vectorcall_offset = offsetof(SpanMethod, vectorcall),
	.tp_call = PyVectorcall_Call,
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_METHOD_DESCRIPTOR | Py_TPFLAGS_HAVE_VECTORCALL,
	.tp_doc = "Span.start with the snapshot taken after it, or Span.end with the gil.* figures set first "
		  "(Hooks.start_method and Hooks.end_method make them).",
	.tp_traverse = (traverseproc)SpanMethod_traverse,
	.tp_clear = (inquiry)SpanMethod_clear,
	.tp_members = SpanMethod_members,
	.tp_getset = SpanMethod_getset,
	.tp_descr_get = bind_method,
};

static PyObject *span_method(Hooks *self, PyObject *original, PyObject *scope, vectorcallfunc call)
{
	if (!PyCallable_Check(original)) {
		PyErr_SetString(PyExc_TypeError, "the original must be the Span method replaced");
		return NULL;
	}
	SpanMethod *method = PyObject_GC_New(SpanMethod, &SpanMethodType);
	if (method == NULL)
		return NULL;
	Py_INCREF(self), method->hooks = self;
	Py_INCREF(original), method->original = original;
	Py_XINCREF(scope), method->scope = scope;
	method->vectorcall = call;
	PyObject_GC_Track(method);
	return (PyObject *)method;
}

static PyObject *Hooks_start_method(Hooks *self, PyObject *const *args, Py_ssize_t nargs)
{
	if (nargs != 2) {
		PyErr_SetString(PyExc_TypeError, "start_method(original, scope)");
		return NULL;
	}
	return span_method(self, args[0], args[1], (vectorcallfunc)start_vectorcall);
}

static PyObject *Hooks_end_method(Hooks *self, PyObject *original)
{
	return span_method(self, original, NULL, (vectorcallfunc)end_vectorcall);
}

static PyObject *Hooks_get_enabled(Hooks *self, void *closure)
{
	return PyBool_FromLong(self->enabled);
}

static int Hooks_set_enabled(Hooks *self, PyObject *value, void *closure)
{
	int truth = value ? PyObject_IsTrue(value) : -1;
	if (truth < 0) {
		if (!PyErr_Occurred())
			PyErr_SetString(PyExc_TypeError, "enabled cannot be deleted");
		return -1;
	}
	self->enabled = truth;
	return 0;
}

static PyMethodDef Hooks_methods[] = {
	{"start_method", (PyCFunction)(void (*)(void))Hooks_start_method, METH_FASTCALL,
	 "start_method(original, scope): the replacement of Span.start, snapshotting the spans whose "
	 "_span_processor is scope (their provider's)."},
	{"end_method", (PyCFunction)Hooks_end_method, METH_O,
	 "end_method(original): the replacement of Span.end (original: the Span.end it replaces)."},
	{NULL},
};

static PyGetSetDef Hooks_getset[] = {
	{"enabled", (getter)Hooks_get_enabled, (setter)Hooks_set_enabled, "False after the processor shut down.", NULL},
	{NULL},
};

PyTypeObject HooksType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "otel_gil._fastspan.Hooks",
	.tp_basicsize = sizeof(Hooks),
	.tp_dealloc = (destructor)Hooks_dealloc,
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
	.tp_doc = "Hooks(registration, metrics, ok, on_start, end, server, server_kind, every=False): the span hooks, in C "
		  "(every: every figure on every span).",
	.tp_traverse = (traverseproc)Hooks_traverse,
	.tp_clear = (inquiry)Hooks_clear,
	.tp_methods = Hooks_methods,
	.tp_getset = Hooks_getset,
	.tp_init = (initproc)Hooks_init,
	.tp_new = PyType_GenericNew,
};

/* ---------------------------------------------------------------- thread contexts */

/* {threading ident: contextvars.Context} of this interpreter's threads that have one.
 * Blame's rare path (a span with long waits) finds there the span the thread that held
 * the GIL is in; nothing of this runs per span. Called with the GIL held. */
static PyObject *thread_contexts(PyObject *module, PyObject *unused)
{
	PyObject *out = PyDict_New();
	if (out == NULL)
		return NULL;
	PyInterpreterState *interp = PyThreadState_GetInterpreter(PyThreadState_Get());
	for (PyThreadState *t = PyInterpreterState_ThreadHead(interp); t != NULL; t = PyThreadState_Next(t)) {
		if (t->context == NULL)
			continue;
		PyObject *ident = PyLong_FromUnsignedLong(t->thread_id);
		if (ident == NULL || PyDict_SetItem(out, ident, t->context)) {
			Py_XDECREF(ident);
			Py_DECREF(out);
			return NULL;
		}
		Py_DECREF(ident);
	}
	return out;
}

static PyMethodDef module_methods[] = {
	{"thread_contexts", thread_contexts, METH_NOARGS,
	 "{threading ident: contextvars.Context} of the interpreter's threads (for blame: whose span held the GIL)."},
	{"track_contexts", (PyCFunction)(void (*)(void))contexts_track, METH_FASTCALL,
	 "track_contexts(hooks, var, key): the hooks' spans get their own code's figures, on whichever thread, task "
	 "or greenlet it runs (var: OpenTelemetry's ContextVar, key: the current span's key in it)."},
	{"untrack_contexts", contexts_untrack, METH_NOARGS, "untrack_contexts(): undo track_contexts."},
	{"hook_loop_modules", contexts_hook_modules, METH_NOARGS,
	 "hook_loop_modules(): while contexts are tracked, hook the loop modules of module_switches() loaded now."},
	{"module_switches", module_switches_state, METH_NOARGS,
	 "module_switches() -> {module: {hooked, entries, object, error}}: the extension modules whose GOT entries of "
	 "PyContext_Enter/Exit are (or were) hooked while contexts are tracked (before 3.14)."},
	{"held_by", (PyCFunction)(void (*)(void))contexts_held_by, METH_FASTCALL,
	 "held_by(tid, start_ns, end_ns): (name, span id) of the span whose code ran longest then on a thread "
	 "whose contexts switch, () if none's; None for a thread that never switched."},
	{NULL},
};

/* ---------------------------------------------------------------- module */

/* The attribute keys the hooks set, by their names in otel_gil.semconv (the one place of every key). */
static int keys_from_semconv(void)
{
	struct {
		PyObject **slot;
		const char *name;
	} keys[] = {
		{&k_thread_name, "THREAD_NAME"}, {&k_thread_id, "THREAD_ID"}, {&k_wait_ms, "GIL_WAIT_MS"},
		{&k_hold_ms, "GIL_HOLD_MS"}, {&k_wait_ratio, "GIL_WAIT_RATIO"}, {&k_hold_ratio, "GIL_HOLD_RATIO"},
		{&k_acquisitions, "GIL_ACQUISITIONS"}, {&k_convoy_waits, "GIL_CONVOY_WAITS"},
		{&k_others_hold_ms, "GIL_OTHERS_HOLD_MS"}, {&k_http_route, "HTTP_ROUTE"},
	};
	PyObject *semconv = PyImport_ImportModule("otel_gil.semconv");
	if (semconv == NULL)
		return -1;
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		PyObject *key = PyObject_GetAttrString(semconv, keys[i].name);
		if (key == NULL || !PyUnicode_CheckExact(key)) {
			if (key != NULL)
				PyErr_Format(PyExc_TypeError, "otel_gil.semconv.%s is not a str", keys[i].name);
			Py_XDECREF(key);
			Py_DECREF(semconv);
			return -1;
		}
		PyUnicode_InternInPlace(&key);
		*keys[i].slot = key;
	}
	Py_DECREF(semconv);
	return 0;
}

/* The SDK's and otel_gil's own attribute names the hooks look up. */
static int intern_all(void)
{
	struct {
		PyObject **slot;
		const char *text;
	} names[] = {
		{&s_state, "state"}, {&s_ring, "ring"}, {&s_generation, "generation"}, {&s_status, "status"}, {&s_address, "_address"},
		{&s_nslots, "nslots"}, {&s_long_wait_ns, "long_wait_ns"}, {&s_start_attr, "_otel_gil_start"},
		{&s_start_time, "_start_time"}, {&s_end_time, "_end_time"}, {&s_end_time_kw, "end_time"}, {&s_attributes, "_attributes"},
		{&s_dict, "_dict"}, {&s_immutable, "_immutable"},
		{&s_max_value_len, "max_value_len"}, {&s_maxlen, "maxlen"},
		{&s_active, "_active"}, {&s_private_name, "_name"}, {&s_public_name, "name"}, {&s_kind, "_kind"},
		{&s_set_attributes, "set_attributes"}, {&s_span_processor, "_span_processor"}, {&s_thread_key, "otel_gil.thread"},
		{&s_start, "start"}, {&s_lock, "_lock"}, {&s_locked, "locked"}, {&s_wrapped, "__wrapped__"},
	};
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if ((*names[i].slot = PyUnicode_InternFromString(names[i].text)) == NULL)
			return -1;
	PyObject *thread = PyImport_ImportModule("_thread");
	lock_type = thread ? (PyTypeObject *)PyObject_GetAttrString(thread, "LockType") : NULL;
	if (lock_type != NULL && !PyType_Check(lock_type)) {
		Py_CLEAR(lock_type);
		PyErr_SetString(PyExc_TypeError, "_thread.LockType is not a type");
	}
	lock_locked = lock_type ? PyObject_GetAttrString((PyObject *)lock_type, "locked") : NULL;
	PyObject *probe = lock_locked ? PyObject_CallMethod(thread, "allocate_lock", NULL) : NULL;
	int probed = probe == NULL ? -1 : Py_IS_TYPE(probe, lock_type) ? lock_probe(probe) : 0;
	Py_XDECREF(thread);
	Py_XDECREF(probe);
	if (probed < 0)
		return -1;
	for (size_t i = 0; i < KEY_SETS; i++)
		if ((key_sets[i] = PyDict_New()) == NULL)
			return -1;
	if ((zero = PyFloat_FromDouble(0.0)) == NULL)
		return -1;
	return lock_locked == NULL ? -1 : keys_from_semconv();
}

static struct PyModuleDef fastspan_module = {
	PyModuleDef_HEAD_INIT,
	.m_name = "otel_gil._fastspan",
	.m_doc = "The common case of otel_gil.spans' hooks, in C.",
	.m_size = -1,
	.m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__fastspan(void)
{
	if (intern_all() || contexts_init(NULL) || PyType_Ready(&StartType) || PyType_Ready(&HooksType) || PyType_Ready(&SpanMethodType) ||
	    PyType_Ready(&RatioCounterType) || (OwnType.tp_name == NULL && PyStructSequence_InitType2(&OwnType, &own_desc)))
		return NULL;
	if (pthread_atfork(NULL, NULL, count_fork) != 0) {
		PyErr_SetString(PyExc_OSError, "pthread_atfork failed");
		return NULL;
	}
	PyObject *m = PyModule_Create(&fastspan_module);
	if (m == NULL)
		return NULL;
	Py_INCREF(&StartType);
	Py_INCREF(&HooksType);
	Py_INCREF(&RatioCounterType);
	Py_INCREF(&OwnType);
	if (PyModule_AddObject(m, "Start", (PyObject *)&StartType) || PyModule_AddObject(m, "Hooks", (PyObject *)&HooksType) ||
	    PyModule_AddObject(m, "RatioCounter", (PyObject *)&RatioCounterType) ||
	    PyModule_AddObject(m, "Own", (PyObject *)&OwnType) ||
	    PyModule_AddIntConstant(m, "SLOT_SIZE", sizeof(struct gil_slot)) ||
	    PyModule_AddIntConstant(m, "LAYOUT_VERSION", GIL_LAYOUT_VERSION) ||
	    PyModule_AddIntConstant(m, "CLOCK_SLACK_NS", CLOCK_SLACK_NS)) {
		Py_DECREF(m);
		return NULL;
	}
	return m;
}

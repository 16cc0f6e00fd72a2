/* A span's long wait in C: spans.figures' blame for the common case, one long wait in
 * the span on a thread with a slot, its blocker named from the hold log, its gil.wait
 * event appended and the gil.top_blocker.* attributes, as the Python hooks leave them
 * (tests/integration/test_long_wait_hooks.py and tests/unit/test_spans.py hold both against each other).
 *
 * Everything rarer is the Python hooks' (long_waits_read returns 0): several waits or
 * dropped ones, more holds or holders than kept here, a blocker named only from /proc or
 * whose thread is in a span (or switches contexts), a wait drawn as a span of its own,
 * a location gone from the ring with metrics to count it, limits the SDK would apply.
 */
#include "long_waits.h"

#define MAX_HOLDS 64    /* holds of the log overlapping the wait kept here */
#define MAX_HOLDERS 8   /* threads among them */
#define LISTED 4        /* blame.LISTED */
#define MAX_OWNERS 8    /* a kernel id's owners read here (threads._Memory keeps them) */

static int ready = 0;   /* 1: initialized, -1: failed for good (the Python hooks do it all) */
static PyObject *threads_dict, *ident_property, *name_property, *s_t_private_ident, *s_t_private_name;
static PyObject *wait_spans_dict, *handed_name, *closed; /* wait_spans' dict, _HANDED, _CLOSED */
static PyObject *threads_module, *wait_spans_module, *event_type, *bounded_type, *context_var, *span_key;
static PyObject *deque_type, *deque_maxlen, *deque_append; /* collections.deque's, its maxlen and append (borrowed) */
static PyObject *s_end_time, *s_memory, *s_generation, *s_freed, *s_owners, *s_horizon, *s_since, *s_running, *s_ended,
	*s_ref, *s_ident,
	*s_o_name, *s_t_ident, *s_t_name, *s_threshold, *s_events, *s_dq, *s_limits,
	*s_max_event_attrs, *s_max_attr_len, *s_o_dict, *s_immutable, *s_append, *s_lock, *s_maxlen_dq;
static PyObject *k_wait_ms, *k_b_native, *k_b_id, *k_b_name, *k_b_hold, *k_bs_native, *k_bs_name, *k_bs_hold,
	*k_bs_others, *k_b_function, *k_b_file, *k_b_line, *k_b_stack, *k_bs_unrecorded, *k_handoff, *k_forced,
	*k_t_native, *k_t_id, *k_t_name, *k_t_hold, *k_t_function, *k_t_file, *k_t_line, *event_name;

static int init_models(void);

static PyObject *attr_of(PyObject *module, const char *name)
{
	return module ? PyObject_GetAttrString(module, name) : NULL;
}

/* "{prefix}{suffix}" from semconv's prefix named `name`. */
static PyObject *key_of(PyObject *semconv, const char *name, const char *suffix)
{
	PyObject *prefix = attr_of(semconv, name);
	PyObject *key = prefix ? PyUnicode_FromFormat("%U%s", prefix, suffix) : NULL;
	Py_XDECREF(prefix);
	if (key != NULL)
		PyUnicode_InternInPlace(&key);
	return key;
}

static int init(void)
{
	PyObject *semconv = PyImport_ImportModule("otel_gil.semconv");
	threads_module = PyImport_ImportModule("otel_gil.threads");
	wait_spans_module = PyImport_ImportModule("otel_gil.wait_spans");
	PyObject *sdk = PyImport_ImportModule("opentelemetry.sdk.trace");
	PyObject *attributes = PyImport_ImportModule("opentelemetry.attributes");
	PyObject *context = PyImport_ImportModule("opentelemetry.context");
	PyObject *propagation = PyImport_ImportModule("opentelemetry.trace.propagation");
	PyObject *runtime = attr_of(context, "_RUNTIME_CONTEXT");
	PyObject *threading = PyImport_ImportModule("threading"), *thread = attr_of(threading, "Thread");
	ident_property = thread ? _PyType_Lookup((PyTypeObject *)thread, s_t_ident = PyUnicode_InternFromString("ident")) : NULL;
	name_property = thread ? _PyType_Lookup((PyTypeObject *)thread, s_t_name = PyUnicode_InternFromString("name")) : NULL;
	Py_XINCREF(ident_property);
	Py_XINCREF(name_property);
	Py_XDECREF(threading);
	Py_XDECREF(thread);
	threads_dict = threads_module ? PyModule_GetDict(threads_module) : NULL;
	wait_spans_dict = wait_spans_module ? PyModule_GetDict(wait_spans_module) : NULL;
	handed_name = attr_of(wait_spans_module, "_HANDED");
	closed = attr_of(wait_spans_module, "_CLOSED");
	if (handed_name != NULL && PyUnicode_CheckExact(handed_name))
		PyUnicode_InternInPlace(&handed_name);
	event_type = attr_of(sdk, "Event");
	bounded_type = attr_of(attributes, "BoundedAttributes");
	context_var = attr_of(runtime, "_current_context");
	span_key = attr_of(propagation, "_SPAN_KEY");
	struct {
		PyObject **slot;
		const char *text;
	} names[] = {
		{&s_end_time, "_end_time"}, {&s_memory, "_memory"}, {&s_generation, "generation"}, {&s_freed, "freed"},
		{&s_owners, "owners"}, {&s_horizon, "horizon_ns"},
		{&s_since, "since_ns"}, {&s_running, "running_ns"}, {&s_ended, "ended_ns"}, {&s_ref, "ref"},
		{&s_ident, "ident"}, {&s_o_name, "name"}, {&s_t_private_ident, "_ident"}, {&s_t_private_name, "_name"},
		{&s_threshold, "threshold_ns"}, {&s_events, "_events"},
		{&s_dq, "_dq"}, {&s_limits, "_limits"}, {&s_max_event_attrs, "max_event_attributes"},
		{&s_max_attr_len, "max_attribute_length"}, {&s_o_dict, "_dict"}, {&s_immutable, "_immutable"},
		{&s_append, "append"}, {&s_lock, "_lock"}, {&s_maxlen_dq, "maxlen"},
	};
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if ((*names[i].slot = PyUnicode_InternFromString(names[i].text)) == NULL)
			break;
	struct {
		PyObject **slot;
		const char *prefix, *suffix;
	} keys[] = {
		{&k_wait_ms, "GIL_WAIT_MS", ""}, {&k_b_native, "BLOCKER_THREAD", ".native_id"},
		{&k_b_id, "BLOCKER_THREAD", ".id"}, {&k_b_name, "BLOCKER_THREAD", ".name"},
		{&k_b_hold, "BLOCKER_HOLD_MS", ""}, {&k_bs_native, "BLOCKERS_THREAD_NATIVE_ID", ""},
		{&k_bs_name, "BLOCKERS_THREAD_NAME", ""}, {&k_bs_hold, "BLOCKERS_HOLD_MS", ""},
		{&k_bs_others, "BLOCKERS_OTHERS_MS", ""}, {&k_b_function, "BLOCKER", ".code.function.name"},
		{&k_b_file, "BLOCKER", ".code.file.path"}, {&k_b_line, "BLOCKER", ".code.line.number"},
		{&k_b_stack, "BLOCKER_CODE_STACKTRACE", ""}, {&k_bs_unrecorded, "BLOCKERS_UNRECORDED_MS", ""},
		{&k_handoff, "GIL_HANDOFF_MS", ""}, {&k_forced, "GIL_WAIT_FORCED_SWITCH", ""},
		{&k_t_native, "TOP_BLOCKER_THREAD", ".native_id"}, {&k_t_id, "TOP_BLOCKER_THREAD", ".id"},
		{&k_t_name, "TOP_BLOCKER_THREAD", ".name"}, {&k_t_hold, "TOP_BLOCKER_HOLD_MS", ""},
		{&k_t_function, "TOP_BLOCKER", ".code.function.name"}, {&k_t_file, "TOP_BLOCKER", ".code.file.path"},
		{&k_t_line, "TOP_BLOCKER", ".code.line.number"}, {&event_name, "GIL_WAIT", ""},
	};
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]) && !PyErr_Occurred(); i++)
		*keys[i].slot = key_of(semconv, keys[i].prefix, keys[i].suffix);
	PyObject *collections = PyImport_ImportModule("collections");
	deque_type = attr_of(collections, "deque");
	Py_XDECREF(collections);
	if (deque_type && PyType_Check(deque_type) && s_maxlen_dq && s_append) {
		deque_maxlen = _PyType_Lookup((PyTypeObject *)deque_type, s_maxlen_dq);
		deque_append = _PyType_Lookup((PyTypeObject *)deque_type, s_append);
	}
	Py_XDECREF(semconv);
	Py_XDECREF(sdk);
	Py_XDECREF(attributes);
	Py_XDECREF(context);
	Py_XDECREF(propagation);
	Py_XDECREF(runtime);
	int ok = !PyErr_Occurred() && threads_dict && ident_property && name_property && wait_spans_dict && closed &&
		 handed_name && PyUnicode_CheckExact(handed_name) &&
		 event_type && bounded_type && context_var && span_key && deque_maxlen && Py_TYPE(deque_maxlen)->tp_descr_get &&
		 deque_append && init_models() == 0;
	PyErr_Clear();
	return ok ? 1 : -1;
}

/* round(ns / 1e6, 3) as Python has it (blame._ms): the decimal nearest ns / 1e6 as a double
 * (ties: by the side of the exact half the double ns / 1e6 lies on, which round() decides by). */
static PyObject *ms3(int64_t ns)
{
	if (ns == 0) /* (a wait's figures are often that) */
		return float_value(0.0);
	int negative = ns < 0;
	uint64_t a = negative ? -(uint64_t)ns : (uint64_t)ns, q = a / 1000, r = a % 1000;
	if (r > 500) {
		q++;
	} else if (r == 500) {
		long double x = (long double)((double)a / 1e6) * 2000.0L; /* exact: 53 x 11 bits in 64 */
		long double half = (long double)(2 * q + 1);
		if (x > half || (x == half && q % 2)) /* above the half; on it, to even */
			q++;
	}
	double ms = (double)q / 1000.0;
	return PyFloat_FromDouble(negative ? -ms : ms);
}

/* A module's global as last read (borrowed), while the module's dict has the same version tag
 * (PEP 509: a new one, unique in the process, on every change of the dict; gone in 3.14). */
struct global {
	uint64_t tag;
	PyObject *value;
};

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations" /* (ma_version_tag: 3.12, 3.13) */
/* dict[name], borrowed, NULL where absent (perhaps an error set); dict: a module's, one per g. */
static PyObject *global_of(PyObject *dict, PyObject *name, struct global *g)
{
#if !PY_3_14_OR_LATER
	uint64_t tag = ((PyDictObject *)dict)->ma_version_tag;
	if (g->value != NULL && g->tag == tag)
		return g->value;
	g->tag = tag;
#endif
	return g->value = PyDict_GetItemWithError(dict, name);
}
#pragma GCC diagnostic pop

static inline int64_t as_i64(PyObject *value, int *ok)
{
	long v = value ? PyLong_AsLong(value) : 0; /* LP64: as wide, and quicker */
	*ok &= value != NULL && PyLong_Check(value) && !PyErr_Occurred();
	return v;
}

/* The last thread type found to have threading.Thread's ident and name properties, by its
 * version tag (CPython gives a type a new one on any change of it or its bases; 0: none). */
static PyTypeObject *thread_type;
static unsigned int thread_type_version;

/* getattr(thread, name) where its type has threading.Thread's property (its field, `private`, read directly). */
static PyObject *thread_property(PyObject *thread, PyObject *name, PyObject *property, PyObject *private)
{
	return _PyType_Lookup(Py_TYPE(thread), name) == property ? lookup(thread, private) : PyObject_GetAttr(thread, name);
}

/* thread's ident and name (getattr's): *ident, *name new references, NULL on an error. */
static void thread_ident_name(PyObject *thread, PyObject **ident, PyObject **name)
{
	PyTypeObject *type = Py_TYPE(thread);
	if (type == thread_type && type->tp_version_tag == thread_type_version && thread_type_version != 0) {
		*ident = LOOKUP(thread, s_t_private_ident);
		*name = *ident ? LOOKUP(thread, s_t_private_name) : NULL;
		return;
	}
	*ident = thread_property(thread, s_t_ident, ident_property, s_t_private_ident);
	*name = *ident ? thread_property(thread, s_t_name, name_property, s_t_private_name) : NULL;
	if (*name && _PyType_Lookup(type, s_t_ident) == ident_property && _PyType_Lookup(type, s_t_name) == name_property)
		thread_type = type, thread_type_version = type->tp_version_tag; /* (_PyType_Lookup gave it one) */
}

/* What owner() read of threads' memory for a kernel id (its owners, their times, weak
 * references and the horizon), kept while the memory is the same object at the same
 * generation (threads._Memory changes it last in each change of its owners): the name
 * itself is read anew each time (a rename changes no generation). */
#define KEPT_TIDS 8
static struct kept {
	uint32_t tid;
	int n; /* its owners, 0: the entry is free */
	int64_t since[MAX_OWNERS], running[MAX_OWNERS], ended[MAX_OWNERS];
	int has_end[MAX_OWNERS];
	PyObject *owner[MAX_OWNERS], *ref[MAX_OWNERS]; /* new references: the _Owner, its ref */
} kept[KEPT_TIDS];
static PyObject *kept_memory; /* a new reference: the memory kept is of */
static long kept_generation;
static int64_t kept_horizon;
static unsigned next_kept;

static void forget(struct kept *k)
{
	for (int i = 0; i < k->n; i++) {
		Py_CLEAR(k->owner[i]);
		Py_CLEAR(k->ref[i]);
	}
	k->n = 0;
}

/* tid's owners as threads' memory has them now, its freed threads settled, and at most
 * MAX_OWNERS: an entry of kept (the horizon in kept_horizon), or NULL where only threads.owner
 * can tell (memory not kept, /proc to read, freed threads to settle); perhaps an error set. */
static struct kept *kept_of(uint32_t tid)
{
	static struct global memory_global;
	PyObject *memory = global_of(threads_dict, s_memory, &memory_global); /* borrowed */
	if (memory == NULL || memory == Py_None)
		return NULL;
	PyObject *freed = LOOKUP(memory, s_freed), *generation = LOOKUP(memory, s_generation);
	int ok = generation != NULL;
	long gen = ok ? long_value(generation, &ok) : 0;
	ok &= freed != NULL && PyObject_Length(freed) == 0; /* else owners to settle first: Memory.known's */
	Py_XDECREF(freed);
	Py_XDECREF(generation);
	if (!ok)
		return NULL;
	if (memory != kept_memory || gen != kept_generation) {
		for (int i = 0; i < KEPT_TIDS; i++)
			forget(&kept[i]);
		Py_CLEAR(kept_memory);
		PyObject *horizon = lookup(memory, s_horizon);
		kept_horizon = as_i64(horizon, &ok);
		Py_XDECREF(horizon);
		if (!ok)
			return NULL;
		Py_INCREF(memory);
		kept_memory = memory, kept_generation = gen;
	}
	for (int i = 0; i < KEPT_TIDS; i++)
		if (kept[i].n && kept[i].tid == tid)
			return &kept[i];
	PyObject *owners = lookup(memory, s_owners), *key = PyLong_FromUnsignedLong(tid);
	PyObject *list = owners && key && PyDict_CheckExact(owners) ? PyDict_GetItemWithError(owners, key) : NULL;
	Py_ssize_t n = list && PyList_CheckExact(list) ? PyList_GET_SIZE(list) : 0;
	struct kept *k = n > 0 && n <= MAX_OWNERS ? &kept[next_kept++ % KEPT_TIDS] : NULL;
	if (k != NULL) {
		forget(k);
		k->tid = tid;
		for (Py_ssize_t i = 0; i < n && ok; i++) {
			PyObject *o = PyList_GET_ITEM(list, i);
			PyObject *s = lookup(o, s_since), *r = lookup(o, s_running), *e = lookup(o, s_ended);
			k->since[i] = as_i64(s, &ok);
			k->running[i] = as_i64(r, &ok);
			k->has_end[i] = e != NULL && e != Py_None;
			k->ended[i] = k->has_end[i] ? as_i64(e, &ok) : 0;
			k->ref[i] = lookup(o, s_ref);
			ok &= e != NULL && k->ref[i] != NULL;
			Py_INCREF(o);
			k->owner[i] = o, k->n = (int)i + 1;
			Py_XDECREF(s);
			Py_XDECREF(r);
			Py_XDECREF(e);
		}
		if (!ok) {
			forget(k);
			k = NULL;
		}
	}
	Py_XDECREF(owners);
	Py_XDECREF(key);
	return k;
}

/* who(tid, start, end) = otel_gil.threads.owner for a tid whose owners threads knows
 * (a start it saw): *ident and *name new references (None where not known); 0, or -1
 * where only the Python function can tell (kept_of). */
static int owner(uint32_t tid, uint64_t start_ns, uint64_t end_ns, PyObject **ident, PyObject **name)
{
	*ident = *name = NULL;
	const struct kept *k = kept_of(tid);
	int rc = k ? 0 : -1;
	if (k == NULL)
		goto done;
	int64_t s0 = (int64_t)start_ns, e0 = (int64_t)end_ns;
	int n = k->n;
	if (k->has_end[n - 1] && e0 >= k->ended[n - 1])
		goto done; /* past its seen end */
	int could = -1, count = 0;
	for (int i = 0; i < n; i++)
		if (k->since[i] <= e0 && (!k->has_end[i] || s0 < k->ended[i]) && (i + 1 == n || s0 < k->running[i + 1]))
			could = i, count++;
	if (count != 1 || (s0 < k->running[0] && s0 < kept_horizon))
		goto done;
	PyObject *o = k->owner[could], *ref = k->ref[could];
	PyObject *thread = NULL; /* a new reference: the Thread while it lives */
#if PY_3_13_OR_LATER
	if (PyWeakref_Check(ref) && PyWeakref_GetRef(ref, &thread) < 0) {
		rc = -1;
		goto done;
	}
#else
	thread = PyWeakref_Check(ref) ? PyWeakref_GetObject(ref) : NULL;
	Py_XINCREF(thread);
#endif
	*ident = LOOKUP(o, s_ident);
	*name = *ident ? LOOKUP(o, s_o_name) : NULL;
	rc = *name ? 0 : -1;
	if (rc == 0 && thread != NULL && thread != Py_None) { /* _Owner.who: follows renames while its Thread lives */
		PyObject *i, *nm;
		thread_ident_name(thread, &i, &nm);
		if (nm != *name || i != *ident)
			rc = nm && !store_attr(o, s_ident, i) && !store_attr(o, s_o_name, nm) ? 0 : -1;
		Py_XSETREF(*ident, i);
		Py_XSETREF(*name, nm);
	}
	Py_XDECREF(thread);
done:
	if (rc == 0 && *ident == NULL) {
		Py_INCREF(Py_None), *ident = Py_None;
		Py_INCREF(Py_None), *name = Py_None;
	}
	if (rc < 0) {
		Py_CLEAR(*ident);
		Py_CLEAR(*name);
	}
	clear_error();
	return rc;
}

/* Whether some other thread's OpenTelemetry context holds a span (blame would name it: the
 * Python hooks do), or that cannot be told; 0 if none does. */
static int others_in_spans(PyObject *invalid)
{
	PyThreadState *me = PyThreadState_Get();
	PyInterpreterState *interp = PyThreadState_GetInterpreter(me);
	for (PyThreadState *t = PyInterpreterState_ThreadHead(interp); t != NULL; t = PyThreadState_Next(t)) {
		if (t == me || t->context == NULL)
			continue;
		PyObject *current = PyDict_Check(t->context) ? NULL : PyObject_GetItem(t->context, context_var);
		if (current == NULL) {
			if (!PyErr_ExceptionMatches(PyExc_KeyError))
				return clear_error(), 1;
			PyErr_Clear();
			continue;
		}
		PyObject *span = PyDict_Check(current) ? PyDict_GetItemWithError(current, span_key) : current;
		int in_span = span != NULL && span != invalid;
		Py_DECREF(current);
		clear_error();
		if (in_span)
			return 1;
	}
	return 0;
}

/* A str from what a writer kept of it (ring._text). */
static PyObject *text(const char *field, size_t size, unsigned kind, uint32_t length, int keep_end)
{
	uint64_t whole = (uint64_t)length * kind;
	Py_ssize_t n = (Py_ssize_t)(whole < size ? whole : size);
	int order = -1;
	PyObject *s = kind == 1 ? PyUnicode_DecodeLatin1(field, n, "replace")
		    : kind == 2 ? PyUnicode_DecodeUTF16(field, n, "replace", &order)
		    : kind == 4 ? PyUnicode_DecodeUTF32(field, n, "replace", &order) : PyUnicode_New(0, 0);
	if (s == NULL || kind == 0 || (kind != 1 && kind != 2 && kind != 4) || whole <= size)
		return s;
	PyObject *cut = PyUnicode_FromString("\xe2\x80\xa6");
	PyObject *r = cut ? (keep_end ? PyUnicode_Concat(cut, s) : PyUnicode_Concat(s, cut)) : NULL;
	Py_XDECREF(cut);
	Py_DECREF(s);
	return r;
}

struct hold {
	uint64_t start, end, index;
	uint32_t tid;
};

/* Holds of the log that ended after since_ns, oldest first (ring.Ring.holds_since): their
 * count, -1 where more than max. */
static int holds_since(const char *base, uint32_t nslots, uint64_t since_ns, struct hold *out, int max)
{
	const volatile struct gil_header *h = (const volatile struct gil_header *)base;
	const char *log = base + (nslots + 1) * sizeof(struct gil_slot);
	uint64_t written = __atomic_load_n(&((const struct gil_header *)base)->holds_written, __ATOMIC_ACQUIRE);
	int n = 0;
	for (int64_t i = (int64_t)written - 1; i >= 0 && i >= (int64_t)written - GIL_HOLD_LOG_LEN; i--) {
		uint64_t pos = (uint64_t)i % GIL_HOLD_LOG_LEN;
		const volatile struct gil_hold *r = &((const volatile struct gil_hold_page *)(
			log + pos / GIL_HOLDS_PER_PAGE * sizeof(struct gil_slot)))->holds[pos % GIL_HOLDS_PER_PAGE];
		struct hold hold = {r->start_ns, r->end_ns, (uint64_t)i, r->tid};
		if (hold.end <= since_ns)
			break;
		if (n == max)
			return -1;
		out[n++] = hold;
	}
	int64_t oldest = (int64_t)h->holds_written - GIL_HOLD_LOG_LEN + 1; /* the writer may be at the one before */
	int kept = 0; /* newest first: the overwritten ones are the last */
	while (kept < n && (int64_t)out[kept].index >= oldest)
		kept++;
	for (int i = 0; i < kept / 2; i++) {
		struct hold t = out[i];
		out[i] = out[kept - 1 - i], out[kept - 1 - i] = t;
	}
	return kept;
}

#define LOCATIONS 16 /* locations decoded lately, kept with their strings */
static struct known {
	struct gil_frame frames[GIL_LOC_FRAMES];
	uint32_t nframes;
	PyObject *function, *file, *line, *stack; /* its innermost frame's (line NULL where 0), its stacktrace */
} known[LOCATIONS];
static unsigned next_known;

/* A location's strings (blame.code_attributes, blame.stacktrace): its entry in known, or NULL on an error. */
static const struct known *decoded(const struct gil_frame *frames, uint32_t nframes)
{
	for (int i = 0; i < LOCATIONS; i++)
		if (known[i].stack && known[i].nframes == nframes && !memcmp(known[i].frames, frames, nframes * sizeof(*frames)))
			return &known[i];
	PyObject *rows = PyList_New(0), *function = NULL, *file = NULL, *line = NULL;
	for (uint32_t i = 0; rows && i < nframes; i++) {
		const struct gil_frame *f = &frames[i];
		PyObject *fn = text(f->name, GIL_LOC_NAME, f->name_kind, f->name_len, 0);
		PyObject *path = fn ? text(f->file, GIL_LOC_FILE, f->file_kind, f->file_len, 1) : NULL;
		PyObject *row = path ? (f->line ? PyUnicode_FromFormat("%U (%U:%u)", fn, path, f->line)
						: PyUnicode_FromFormat("%U (%U:?)", fn, path)) : NULL;
		if (i == 0 && row) {
			function = fn, file = path, fn = path = NULL;
			line = f->line ? PyLong_FromUnsignedLong(f->line) : NULL;
		}
		Py_XDECREF(fn);
		Py_XDECREF(path);
		if (row == NULL || PyList_Append(rows, row))
			Py_CLEAR(rows);
		Py_XDECREF(row);
	}
	PyObject *newline = rows ? PyUnicode_FromString("\n") : NULL;
	PyObject *stack = newline ? PyUnicode_Join(newline, rows) : NULL;
	Py_XDECREF(newline);
	Py_XDECREF(rows);
	if (stack == NULL || (frames[0].line && line == NULL)) {
		Py_XDECREF(function);
		Py_XDECREF(file);
		Py_XDECREF(line);
		Py_XDECREF(stack);
		return NULL;
	}
	struct known *k = &known[next_known++ % LOCATIONS];
	Py_XDECREF(k->function);
	Py_XDECREF(k->file);
	Py_XDECREF(k->line);
	Py_XDECREF(k->stack);
	*k = (struct known){.nframes = nframes, .function = function, .file = file, .line = line, .stack = stack};
	memcpy(k->frames, frames, nframes * sizeof(*frames));
	return k;
}

/* The location of hold `index` (ring.Ring.location), decoded (*out: borrowed, kept in known);
 * 0, 1 where it is not in the ring (blame: unlocated), 2 where it has no frame, -1 on an error. */
static int location(const char *base, uint32_t nslots, uint64_t index, const struct known **out)
{
	const volatile struct gil_location *live = (const volatile struct gil_location *)(
		base + (1 + nslots + GIL_HOLD_PAGES + index % GIL_LOC_LEN) * sizeof(struct gil_slot));
	uint64_t done = 2 * index + 2;
	if (live->seq != done)
		return 1;
	struct gil_location copy;
	__atomic_thread_fence(__ATOMIC_ACQUIRE);
	memcpy(&copy, (const void *)live, sizeof(copy));
	__atomic_thread_fence(__ATOMIC_ACQUIRE);
	if (live->seq != done)
		return 1;
	uint32_t nframes = copy.nframes < GIL_LOC_FRAMES ? copy.nframes : GIL_LOC_FRAMES;
	if (nframes == 0)
		return 2;
	*out = decoded(copy.frames, nframes);
	return *out ? 0 : -1;
}

void long_waits_clear(struct long_waits *lw)
{
	for (int i = 0; i < lw->n; i++)
		Py_CLEAR(lw->values[i]);
	Py_CLEAR(lw->event);
	lw->close_handed = 0;
	lw->n = 0;
}

#define PUT(into, key, value) (keys[n] = (key), failed |= (into[n++] = (value)) == NULL)

/* Instances of the SDK's BoundedAttributes and Event as their constructors leave them, made
 * without running those (Python code, some 3,000 instructions each): the attributes of a model
 * instance made once (vars(), in their order), those that differ per instance given anew. */
#define MODEL_ATTRS 8
struct model {
	PyTypeObject *type;
	int n;
	PyObject *names[MODEL_ATTRS], *values[MODEL_ATTRS];
	int given[MODEL_ATTRS]; /* names[i]'s index among those given per instance, -1: values[i] */
};
static struct model bounded_model, event_model;
/* The lock of our events' BoundedAttributes, one for them all: an immutable one takes it only to
 * copy its dict (__iter__, __deepcopy__), never while it holds another's (the SDK makes one each). */
static PyObject *events_lock;
static PyObject *empty_tuple, *s_name_, *s_timestamp, *s_attributes_;
static PyObject *event_dicts[64]; /* dict_fill_empty's models, by the optional keys an event has */

/* Learn obj's attributes as a model: 0, or -1 where instances cannot be made so (a __new__ of
 * its type's own, no instance dict, an attribute not among `given` that is not immutable). */
static int learn(struct model *m, PyObject *obj, PyObject *const *given, int n_given)
{
	PyObject *d = obj && Py_TYPE(obj)->tp_new == PyBaseObject_Type.tp_new ? PyObject_GenericGetDict(obj, NULL) : NULL;
	int ok = d != NULL && PyDict_CheckExact(d) && PyDict_GET_SIZE(d) <= MODEL_ATTRS, found = 0;
	PyObject *key, *value;
	for (Py_ssize_t pos = 0; ok && PyDict_Next(d, &pos, &key, &value);) {
		int mine = -1;
		for (int j = 0; j < n_given; j++)
			if (PyUnicode_Compare(key, given[j]) == 0)
				mine = j;
		found += mine >= 0;
		ok = PyUnicode_CheckExact(key) && (mine >= 0 || value == Py_None || PyBool_Check(value) ||
						   PyLong_CheckExact(value) || PyUnicode_CheckExact(value));
		Py_INCREF(key);
		PyUnicode_InternInPlace(&key);
		Py_INCREF(value);
		m->given[m->n] = mine, m->names[m->n] = key, m->values[m->n++] = value;
	}
	Py_XDECREF(d);
	if (ok && found == n_given) {
		Py_INCREF(Py_TYPE(obj));
		m->type = Py_TYPE(obj);
	}
	clear_error();
	return ok && found == n_given ? 0 : -1;
}

/* A new instance of the model's type with its attributes, those given set to given[j] in learn's
 * order (NULL: the model's values). */
static PyObject *instance(const struct model *m, PyObject *const *given)
{
	PyObject *obj = m->type->tp_new(m->type, empty_tuple, NULL);
	for (int i = 0; obj && i < m->n; i++)
		if (store_attr(obj, m->names[i], given && m->given[i] >= 0 ? given[m->given[i]] : m->values[i]))
			Py_CLEAR(obj);
	return obj;
}

static int init_models(void)
{
	s_name_ = PyUnicode_InternFromString("_name");
	s_timestamp = PyUnicode_InternFromString("_timestamp");
	s_attributes_ = PyUnicode_InternFromString("_attributes");
	empty_tuple = PyTuple_New(0);
	PyObject *kwnames = Py_BuildValue("(s)", "immutable");
	PyObject *none_true[] = {Py_None, Py_True};
	PyObject *bounded = kwnames ? PyObject_Vectorcall(bounded_type, none_true, 1, kwnames) : NULL;
	PyObject *args[] = {event_name, bounded, PyLong_FromLong(0)};
	PyObject *ev = bounded && args[2] ? PyObject_Vectorcall(event_type, args, 3, NULL) : NULL;
	events_lock = bounded ? PyObject_GetAttr(bounded, s_lock) : NULL; /* one of the SDK's own */
	PyObject *b_given[] = {s_o_dict, s_lock, s_maxlen_dq, s_immutable}, *e_given[] = {s_name_, s_timestamp, s_attributes_};
	int failed = ev == NULL || events_lock == NULL || learn(&bounded_model, bounded, b_given, 4) ||
		     learn(&event_model, ev, e_given, 3);
	Py_XDECREF(kwnames);
	Py_XDECREF(bounded);
	Py_XDECREF(args[2]);
	Py_XDECREF(ev);
	for (int i = 0; i < 64 && !failed; i++)
		failed = (event_dicts[i] = PyDict_New()) == NULL;
	const struct model *models[] = {&bounded_model, &event_model};
	for (int m = 0; m < 2 && !failed; m++) { /* store_attr's way into the types' instances, learned on one */
		PyObject *probe = instance(models[m], NULL);
		for (int i = 0; probe && i < models[m]->n; i++)
			Py_XDECREF(lookup(probe, models[m]->names[i]));
		failed = probe == NULL;
		Py_XDECREF(probe);
	}
	return failed || PyErr_Occurred() ? -1 : 0;
}

/* The gil.wait event object, made as span.add_event would (its attributes are ours, clean; `which`:
 * the bits of its optional keys): a new reference, NULL (no error) where the SDK would apply a limit,
 * or on an error. */
static PyObject *event(PyObject *span, PyObject *const *keys, PyObject *const *values, int n, unsigned which,
		       int64_t timestamp)
{
	PyObject *limits = LOOKUP(span, s_limits);
	PyObject *maxlen = limits ? LOOKUP(limits, s_max_event_attrs) : NULL;
	PyObject *mvl = maxlen ? LOOKUP(limits, s_max_attr_len) : NULL;
	PyObject *result = NULL;
	if (mvl == Py_None && (maxlen == Py_None || (PyLong_Check(maxlen) && PyLong_AsLong(maxlen) >= n))) {
		PyObject *d = PyDict_New();
		int rc = d ? dict_fill_empty(d, event_dicts[which], keys, values, n) : -1;
		for (int i = 0; rc == 0 && i < n; i++)
			rc = PyDict_SetItem(d, keys[i], values[i]);
		PyObject *b_values[] = {d, events_lock, maxlen, Py_True}; /* init_models' b_given */
		PyObject *bounded = rc >= 0 ? instance(&bounded_model, b_values) : NULL;
		PyObject *ts = bounded ? long_from(timestamp) : NULL;
		PyObject *e_values[] = {event_name, ts, bounded}; /* init_models' e_given */
		result = ts ? instance(&event_model, e_values) : NULL;
		Py_XDECREF(d);
		Py_XDECREF(bounded);
		Py_XDECREF(ts);
	}
	Py_XDECREF(limits);
	Py_XDECREF(maxlen);
	Py_XDECREF(mvl);
	clear_error();
	return result;
}

/* The tuples of the last wait's blockers listed (kernel ids, names), for the next with the same ids
 * and the same names (objects) as who() gives them: tuples, immutable, that events may share. */
static struct {
	int listed;
	uint32_t tids[LISTED];
	PyObject *names[LISTED]; /* who(t)[1] (None, "": str(t) in the tuple); new references */
	PyObject *natives, *names_tuple;
} last_listed;

/* blame.event_attributes' blockers.thread.native_id and .name for those listed (names: who's):
 * *natives, *names_tuple new references; 0, or -1 with an error set. */
static int blockers(const uint32_t *tids, PyObject *const *names, int listed, PyObject **natives, PyObject **names_tuple)
{
	int same = last_listed.listed == listed && last_listed.natives != NULL;
	for (int i = 0; same && i < listed; i++)
		same = last_listed.tids[i] == tids[i] && last_listed.names[i] == names[i];
	if (!same) {
		PyObject *n = PyTuple_New(listed), *t = PyTuple_New(listed);
		for (int i = 0; n && t && i < listed; i++) {
			PyObject *name = names[i];
			if (name == Py_None || (PyUnicode_Check(name) && PyUnicode_GET_LENGTH(name) == 0))
				name = PyUnicode_FromFormat("%u", tids[i]);
			else
				Py_INCREF(name);
			PyTuple_SET_ITEM(n, i, PyLong_FromUnsignedLong(tids[i]));
			PyTuple_SET_ITEM(t, i, name);
			if (name == NULL || PyTuple_GET_ITEM(n, i) == NULL)
				Py_CLEAR(n);
		}
		if (n == NULL || t == NULL) {
			Py_XDECREF(n);
			Py_XDECREF(t);
			return -1;
		}
		for (int i = 0; i < LISTED; i++) {
			Py_XINCREF(i < listed ? names[i] : NULL);
			Py_XSETREF(last_listed.names[i], i < listed ? names[i] : NULL);
			last_listed.tids[i] = i < listed ? tids[i] : 0;
		}
		last_listed.listed = listed;
		Py_XSETREF(last_listed.natives, n);
		Py_XSETREF(last_listed.names_tuple, t);
	}
	Py_INCREF(last_listed.natives);
	Py_INCREF(last_listed.names_tuple);
	*natives = last_listed.natives, *names_tuple = last_listed.names_tuple;
	return 0;
}

int long_waits_read(Start *start, PyObject *span, uint64_t now, const struct counters *end, struct long_waits *lw)
{
	if (ready == 0)
		ready = init();
	if (ready < 0 || end->long_waits < start->counters.long_waits ||
	    end->long_waits - start->counters.long_waits != 1 || tls.index < 0)
		return 0; /* not one wait: the Python hooks */
	const volatile struct gil_slot *slot = slot_at(start->base, tls.index);
	const volatile struct gil_long_wait *lwr = &slot->ring[(end->long_waits - 1) % GIL_RING_LEN];
	uint64_t w_start = lwr->start_ns, w_end = lwr->end_ns, w_held = lwr->held_ns;
	uint32_t w_blocker = lwr->blocker_tid, w_flags = lwr->flags;
	if (slot->long_waits != end->long_waits)
		return 0;
	if (w_start < (uint64_t)start->mono_ns || w_end > now)
		return 0; /* not the span's (spans.figures leaves it out) */
	static struct global threshold_global;
	PyObject *threshold = global_of(wait_spans_dict, s_threshold, &threshold_global); /* borrowed */
	long long threshold_ns = threshold && PyLong_Check(threshold) ? PyLong_AsLongLong(threshold) : -1;
	PyObject *handed = threshold_ns ? lookup(span, handed_name) : NULL;
	Py_XDECREF(handed);
	clear_error();
	if (threshold_ns && (threshold_ns < 0 || handed != NULL || w_end - w_start >= (uint64_t)threshold_ns))
		return 0; /* wait_spans.draw has a span to draw (or waits handed up to draw): the Python hooks */
	lw->close_handed = threshold_ns != 0;
	struct hold holds[MAX_HOLDS];
	int nh = holds_since(start->base, start->nslots, w_start, holds, MAX_HOLDS);
	if (nh < 0) {
		long_waits_clear(lw);
		return 0;
	}
	/* blame.HoldLog.blame: ns each thread held the GIL during the wait, most first (ties: first held) */
	uint32_t tids[MAX_HOLDERS];
	uint64_t ns[MAX_HOLDERS];
	int nt = 0, first = 0;
	while (first < nh && holds[first].end <= w_start)
		first++;
	for (int i = first; i < nh && holds[i].start < w_end; i++) {
		int k = 0;
		while (k < nt && tids[k] != holds[i].tid)
			k++;
		if (k == nt) {
			if (nt == MAX_HOLDERS) {
				long_waits_clear(lw);
				return 0;
			}
			tids[nt] = holds[i].tid, ns[nt++] = 0;
		}
		ns[k] += (holds[i].end < w_end ? holds[i].end : w_end) - (holds[i].start > w_start ? holds[i].start : w_start);
	}
	for (int i = 1; i < nt; i++) /* stable insertion sort, most first */
		for (int j = i; j > 0 && ns[j] > ns[j - 1]; j--) {
			uint64_t t = ns[j];
			ns[j] = ns[j - 1], ns[j - 1] = t;
			uint32_t u = tids[j];
			tids[j] = tids[j - 1], tids[j - 1] = u;
		}
	uint64_t sum = 0;
	for (int i = 0; i < nt; i++)
		sum += ns[i];
	int longest = -1;
	uint64_t most = 0;
	for (int i = first; nt && i < nh && holds[i].start < w_end; i++) {
		uint64_t overlap = (holds[i].end < w_end ? holds[i].end : w_end) -
				   (holds[i].start > w_start ? holds[i].start : w_start);
		if (holds[i].tid == tids[0] && overlap > most)
			longest = i, most = overlap;
	}
	const struct known *where = NULL;
	int located = longest >= 0 ? location(start->base, start->nslots, holds[longest].index, &where) : 2;
	PyObject *function = where ? where->function : NULL, *file = where ? where->file : NULL;
	PyObject *line = where ? where->line : NULL, *stack = where ? where->stack : NULL;
	PyObject *ev_keys[24], *ev_values[24], **keys = ev_keys, *names[LISTED] = {NULL}, *ident = NULL, *name = NULL;
	PyObject *listed_natives = NULL, *listed_names = NULL, *hold_ms = NULL; /* new references */
	int n = 0, failed = 0, listed = nt < LISTED ? nt : LISTED, rc = 0;
	if (located < 0 || (located == 1 && start->metrics != Py_None) || (nt && others_in_spans(Py_None)))
		goto done; /* an error; a miss to count; a span the blocker may be in: the Python hooks */
	if (nt && contexts_switching(tids[0]))
		goto done; /* a switching thread: its log tells whose code ran (_fastspan.held_by) */
	uint32_t blocker = nt ? tids[0] : w_blocker;
	if (owner(blocker, w_start, w_end, &ident, &name) < 0)
		goto done;
	for (int i = 0; i < listed; i++) { /* who(t)[1] */
		PyObject *t_ident = ident, *t_name = name; /* the blocker's, named above */
		if (tids[i] != blocker && owner(tids[i], w_start, w_end, &t_ident, &t_name) < 0)
			goto done;
		if (tids[i] == blocker)
			Py_INCREF(t_name);
		else
			Py_DECREF(t_ident);
		names[i] = t_name;
	}
	if (nt && blockers(tids, names, listed, &listed_natives, &listed_names) < 0)
		goto done;
	/* blame.event_attributes, in its order; which: its optional keys, a bit each */
	unsigned which = (ident != Py_None) | (name != Py_None) << 1 | (nt != 0) << 2 | (nt && located == 0) << 3 |
			 (nt && located == 0 && line != NULL) << 4 | ((w_flags & GIL_WAIT_FORCED) != 0) << 5;
	PUT(ev_values, k_wait_ms, ms3((int64_t)(w_end - w_start)));
	if (nt)
		Py_INCREF(PyTuple_GET_ITEM(listed_natives, 0)), PUT(ev_values, k_b_native, PyTuple_GET_ITEM(listed_natives, 0));
	else
		PUT(ev_values, k_b_native, PyLong_FromUnsignedLong(blocker));
	if (ident != Py_None)
		Py_INCREF(ident), PUT(ev_values, k_b_id, ident);
	if (name != Py_None)
		Py_INCREF(name), PUT(ev_values, k_b_name, name);
	if (nt) {
		uint64_t others = 0;
		for (int i = LISTED; i < nt; i++)
			others += ns[i];
		PyObject *held = PyTuple_New(listed);
		for (int i = 0; held && i < listed; i++) {
			PyTuple_SET_ITEM(held, i, ms3((int64_t)ns[i]));
			failed |= PyTuple_GET_ITEM(held, i) == NULL;
		}
		hold_ms = held && !failed ? PyTuple_GET_ITEM(held, 0) : NULL; /* the blocker's, in gil.top_blocker.* too */
		Py_XINCREF(hold_ms);
		Py_XINCREF(hold_ms), PUT(ev_values, k_b_hold, hold_ms);
		Py_INCREF(listed_natives), PUT(ev_values, k_bs_native, listed_natives);
		Py_INCREF(listed_names), PUT(ev_values, k_bs_name, listed_names);
		PUT(ev_values, k_bs_hold, held);
		PUT(ev_values, k_bs_others, ms3((int64_t)others));
		if (located == 0) {
			Py_INCREF(function), PUT(ev_values, k_b_function, function);
			Py_INCREF(file), PUT(ev_values, k_b_file, file);
			if (line)
				Py_INCREF(line), PUT(ev_values, k_b_line, line);
			Py_INCREF(stack), PUT(ev_values, k_b_stack, stack);
		}
	}
	PUT(ev_values, k_bs_unrecorded, ms3(w_held > sum ? (int64_t)(w_held - sum) : 0));
	PUT(ev_values, k_handoff, ms3((int64_t)(w_end - w_start) - (int64_t)w_held));
	if (w_flags & GIL_WAIT_FORCED)
		Py_INCREF(Py_True), PUT(ev_values, k_forced, Py_True);
	if (!failed)
		lw->event = event(span, ev_keys, ev_values, n, which, (int64_t)w_start + start->wall_ns - start->mono_ns);
	for (int i = 0; i < n; i++)
		Py_XDECREF(ev_values[i]);
	if (failed || lw->event == NULL)
		goto done;
	/* the span's gil.top_blocker.* (one wait: its blocker, during it) */
	n = 0;
	keys = lw->keys;
	if (nt) {
		Py_INCREF(PyTuple_GET_ITEM(listed_natives, 0)), PUT(lw->values, k_t_native, PyTuple_GET_ITEM(listed_natives, 0));
		if (ident != Py_None)
			Py_INCREF(ident), PUT(lw->values, k_t_id, ident);
		if (name != Py_None)
			Py_INCREF(name), PUT(lw->values, k_t_name, name);
		Py_INCREF(hold_ms), PUT(lw->values, k_t_hold, hold_ms);
		if (located == 0) {
			Py_INCREF(function), PUT(lw->values, k_t_function, function);
			Py_INCREF(file), PUT(lw->values, k_t_file, file);
			if (line)
				Py_INCREF(line), PUT(lw->values, k_t_line, line);
		}
	}
	lw->n = n;
	rc = failed ? 0 : 1;
done:
	for (int i = 0; i < listed; i++)
		Py_XDECREF(names[i]);
	Py_XDECREF(ident);
	Py_XDECREF(name);
	Py_XDECREF(listed_natives);
	Py_XDECREF(listed_names);
	Py_XDECREF(hold_ms);
	if (rc != 1)
		long_waits_clear(lw);
	clear_error();
	return rc;
}

void long_waits_commit(struct long_waits *lw, PyObject *span, int open)
{
	if (lw->event == NULL && !lw->close_handed)
		return; /* (a calm span's: nothing to do) */
	if (lw->event != NULL) { /* span._add_event: under the span's lock, while it is not ended */
		PyObject *events = LOOKUP(span, s_events);
		PyObject *dq = events ? LOOKUP(events, s_dq) : NULL;
		PyObject *end = !dq ? NULL : open ? (Py_INCREF(Py_None), Py_None) : LOOKUP(span, s_end_time);
		int exact = dq && Py_IS_TYPE(dq, (PyTypeObject *)deque_type); /* its maxlen and append: the type's */
		PyObject *maxlen = !end ? NULL : exact ? Py_TYPE(deque_maxlen)->tp_descr_get(deque_maxlen, dq, deque_type)
						: PyObject_GetAttr(dq, s_maxlen_dq);
		if (maxlen != NULL && end == Py_None && (open || lock_free(span)) && lock_free(events)) {
			int full = maxlen != Py_None && PyObject_Length(dq) >= PyLong_AsSsize_t(maxlen);
			PyObject *args[] = {dq, lw->event};
			PyObject *r = full    ? PyObject_CallMethodOneArg(events, s_append, lw->event) /* its dropped count */
				      : exact ? PyObject_Vectorcall(deque_append, args, 2, NULL)
					      : PyObject_CallMethodOneArg(dq, s_append, lw->event);
			Py_XDECREF(r);
		}
		Py_XDECREF(events);
		Py_XDECREF(dq);
		Py_XDECREF(end);
		Py_XDECREF(maxlen);
	}
	if (lw->close_handed) /* wait_spans.draw: nothing to draw, no hand-ups from now on */
		store_attr(span, handed_name, closed);
	clear_error();
}

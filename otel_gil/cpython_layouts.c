/* The span hooks' reads and writes through CPython's own layouts, where the generic path
 * costs more than the rest of a span's figures: 3.11, 3.12 and 3.13, each its own (their
 * internal headers); other versions take the generic path.
 *
 * Instance attributes (lookup, store_attr): the SDK span's, its BoundedAttributes', the
 * registration's, the thread's. A read through PyObject_GetAttr looks the name up in the
 * type (MRO cache), then hashes it into the type's shared keys: ~190 instructions, paid
 * some twenty times per span. Here a small cache keyed by (type, name) keeps the name's
 * index in the shared keys, taken where the type has no attribute of that name (nothing
 * in the class can shadow the instance's value, nor stand in for it when absent) and no
 * __getattribute__ or __getattr__ of its own; valid while the type's version tag is the
 * same (CPython gives a type a new one on any change of it or its bases), its shared keys
 * are the same object, and the instance's values are there: 3.11, a values pointer (NULL
 * once they moved into a dict of the instance's own); 3.12, the dict-or-values pointer
 * tagged as values; 3.13, inline values after the object, marked valid (a dict made by
 * vars() shares them while it can). As CPython's own LOAD_ATTR_INSTANCE_VALUE checks.
 * Else the generic lookup, which refills it. A call site may keep its own copy of the entry
 * it hit (lookup_at: no hash, no probe while it reads one type's instances), or of several
 * names of one type (fields_read: the type, its keys and the values checked once for all). A store goes
 * there too where the type has no __setattr__ (3.13: and no dict was made of the values).
 *
 * A threading.Lock's state (lock_state): the field its locked() returns, read in place
 * (~90 instructions less than the call), where a lock taken and released at import left it
 * as locked() said each time (lock_probe; the field moved within 3.13's releases).
 *
 * An int's value (long_value, ulong_value): from its 30-bit digits, up to three (a time in ns
 * and a span id have three; PyLong_AsLong takes ~75 instructions to find it); and a time's
 * int made so (long_from: PyLong_FromLongLong counts its digits first, ~120 in all).
 *
 * A span's attribute dict, empty (dict_fill_empty): a copy of a model dict of the same
 * keys, its values replaced in place (PyDict_Update clones a dict's keys into an empty
 * one in one pass; inserting costs ~220 instructions a key, replacing through
 * PyDict_SetItem as much).
 */
#include "fastspan.h"

#define KNOWN_LAYOUT (PY_3_11_ONLY || PY_3_12_ONLY || PY_3_13_ONLY)

#if KNOWN_LAYOUT
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations" /* (the header's inline functions read ma_version_tag) */
#undef _PyGC_FINALIZED /* (3.12: Python.h's macro would rename pycore_gc.h's function) */
#define Py_BUILD_CORE
#include "internal/pycore_dict.h"
#undef Py_BUILD_CORE
#pragma GCC diagnostic pop

/* obj's values, if its attributes are there (type: a type of managed dict), else NULL; as
 * internal/pycore_object.h (which does not build outside CPython) finds them. */
static inline PyDictValues *values_of(PyObject *obj, PyTypeObject *type)
{
#if PY_3_11_ONLY
	return *(((PyDictValues **)obj) - 4);
#elif PY_3_12_ONLY
	uintptr_t dorv = *(((uintptr_t *)obj) - 3); /* _PyObject_DictOrValuesPointer: values + 1 is tagged */
	return dorv & 1 ? (PyDictValues *)(dorv + 1) : NULL;
#else
	if (!(type->tp_flags & Py_TPFLAGS_INLINE_VALUES) || type->tp_basicsize != sizeof(PyObject))
		return NULL;
	PyDictValues *values = (PyDictValues *)((char *)obj + sizeof(PyObject)); /* _PyObject_InlineValues */
	return values->valid ? values : NULL;
#endif
}

#define SLOTS 256 /* a power of 2: the hooks read some 20 names of 5 types */
#define PROBES 4  /* slots a (type, name) may be in, from its hash on */

static struct entry {
	PyTypeObject *type; /* compared, never dereferenced (the version tag tells a reused address) */
	PyObject *name;
	unsigned int version;
	PyDictKeysObject *keys;
	Py_ssize_t index;    /* in keys' entries, -1: not among them (then valid while their count is nentries) */
	Py_ssize_t nentries;
} cache[SLOTS];

static inline size_t slot_of(PyTypeObject *type, PyObject *name)
{
	return (size_t)((((uintptr_t)type ^ (uintptr_t)name) * 0x9E3779B97F4A7C15ULL) >> 56);
}

/* The entry of (type, name), NULL if none. */
static inline struct entry *entry_of(PyTypeObject *type, PyObject *name)
{
	size_t s = slot_of(type, name);
	if (cache[s].type == type && cache[s].name == name)
		return &cache[s];
	for (size_t i = 1; i < PROBES; i++) {
		struct entry *e = &cache[(s + i) & (SLOTS - 1)];
		if (e->type == type && e->name == name)
			return e;
	}
	return NULL;
}

/* The type's shared keys if obj's attributes may be read through them (its values), else NULL. */
static inline PyDictKeysObject *shared_keys(PyObject *obj, PyTypeObject *type)
{
	if (!(type->tp_flags & Py_TPFLAGS_MANAGED_DICT) || type->tp_version_tag == 0 || /* (0: none, or changed) */
	    type->tp_getattro != PyObject_GenericGetAttr || values_of(obj, type) == NULL)
		return NULL;
	PyDictKeysObject *keys = ((PyHeapTypeObject *)type)->ht_cached_keys;
	return keys != NULL && keys->dk_kind == DICT_KEYS_SPLIT ? keys : NULL;
}

/* obj's values, if its type's entry e still says where a name is in them; else NULL. */
static inline PyDictValues *values_at(PyObject *obj, PyTypeObject *type, const struct entry *e)
{
	if (e == NULL || e->version != type->tp_version_tag) /* 0 after any change of the type: never cached */
		return NULL;
	PyDictValues *values = values_of(obj, type); /* (a type of managed dict: its version says it is the same) */
	if (values == NULL || ((PyHeapTypeObject *)type)->ht_cached_keys != e->keys)
		return NULL;
#if PY_3_13_ONLY
	if (e->index >= values->capacity) /* (3.11, 3.12: values as long as the keys, the same object) */
		return NULL;
#endif
	return values;
}

/* Remember where name is for type's instances, if nothing in the type has that name. */
static void fill(PyObject *obj, PyObject *name)
{
	PyTypeObject *type = Py_TYPE(obj);
	if (!PyUnicode_CheckExact(name) || _PyType_Lookup(type, name) != NULL) /* (gives the type a version tag) */
		return;
	PyDictKeysObject *keys = shared_keys(obj, type);
	if (keys == NULL)
		return;
	Py_ssize_t index = -1, hash = PyObject_Hash(name);
	PyDictUnicodeEntry *entries = DK_UNICODE_ENTRIES(keys);
	for (Py_ssize_t i = 0; i < keys->dk_nentries && index < 0; i++) {
		PyObject *key = entries[i].me_key;
		if (key == name || (key != NULL && PyUnicode_CheckExact(key) && PyObject_Hash(key) == hash &&
				    PyUnicode_Compare(key, name) == 0))
			index = i;
	}
	struct entry *e = entry_of(type, name);
	size_t s = slot_of(type, name);
	for (size_t i = 0; e == NULL && i < PROBES; i++)
		if (cache[(s + i) & (SLOTS - 1)].type == NULL)
			e = &cache[(s + i) & (SLOTS - 1)];
	if (e == NULL)
		e = &cache[s]; /* all taken: this one goes */
	*e = (struct entry){type, name, type->tp_version_tag, keys, index, keys->dk_nentries};
}
#endif

/* lookup's generic path, which refills the cache (apart: the cache's path then saves no registers). */
static __attribute__((noinline)) PyObject *lookup_generic(PyObject *obj, PyObject *name)
{
	PyObject *value = NULL;
#if PY_3_13_OR_LATER
	PyObject_GetOptionalAttr(obj, name, &value);
#else
	_PyObject_LookupAttr(obj, name, &value);
#endif
#if KNOWN_LAYOUT
	if (!PyErr_Occurred())
		fill(obj, name);
#endif
	return value;
}

PyObject *lookup(PyObject *obj, PyObject *name)
{
#if KNOWN_LAYOUT
	PyTypeObject *type = Py_TYPE(obj);
	const struct entry *e = entry_of(type, name);
	PyDictValues *values = values_at(obj, type, e);
	if (values != NULL) {
		if (e->index >= 0) {
			PyObject *value = values->values[e->index];
			Py_XINCREF(value);
			return value; /* NULL: not set on obj, and not in its type */
		}
		if (e->keys->dk_nentries == e->nentries)
			return NULL; /* no instance of the type has it: obj neither */
	}
#endif
	return lookup_generic(obj, name);
}

#if KNOWN_LAYOUT
/* obj's values where a site's record (of type, version, keys, the largest index) holds for it, else NULL. */
static inline PyDictValues *recorded_values(PyObject *obj, PyTypeObject *recorded, unsigned int version, void *keys,
					    Py_ssize_t top)
{
	PyTypeObject *type = Py_TYPE(obj);
	if (recorded != type || version != type->tp_version_tag) /* (never 0: no record keeps it) */
		return NULL;
	PyDictValues *values = values_of(obj, type);
	if (values == NULL || (void *)((PyHeapTypeObject *)type)->ht_cached_keys != keys)
		return NULL;
#if PY_3_13_ONLY
	if (top >= values->capacity)
		return NULL;
#else
	(void)top;
#endif
	return values;
}
#endif

PyObject *lookup_at(PyObject *obj, PyObject *name, struct site *site)
{
#if KNOWN_LAYOUT
	PyTypeObject *type = Py_TYPE(obj);
	PyDictValues *values = recorded_values(obj, site->type, site->version, site->keys, site->index);
	if (values != NULL) {
		PyObject *value = values->values[site->index];
		Py_XINCREF(value);
		return value;
	}
	PyObject *value = lookup(obj, name);
	const struct entry *e = entry_of(type, name);
	if (e != NULL && e->index >= 0 && e->version == type->tp_version_tag)
		*site = (struct site){type, e->version, e->keys, e->index};
	return value;
#else
	return lookup(obj, name);
#endif
}

/* fields_read's path where the site's record does not hold: each name looked up, the record
 * refilled (apart: the record's path then saves no registers). A lookup may run Python code that
 * reads through the same site: the record is dropped first and written whole at the end. */
static __attribute__((noinline)) void fields_fill(PyObject *obj, PyObject *const *names, int n, struct fields *site,
						  PyObject **out)
{
#if KNOWN_LAYOUT
	PyTypeObject *type = Py_TYPE(obj);
	struct fields made = {type, 0, NULL, 0, {0}};
	int all = n > 0;
	site->type = NULL;
	for (int i = 0; i < n; i++) {
		out[i] = lookup(obj, names[i]);
		const struct entry *e = entry_of(type, names[i]);
		if (e == NULL || e->index < 0 || e->version != type->tp_version_tag ||
		    (i > 0 && (e->keys != made.keys || e->version != made.version)))
			all = 0;
		else if ((made.index[i] = e->index) > made.top)
			made.top = e->index;
		if (all && i == 0)
			made.keys = e->keys, made.version = e->version;
	}
	if (all && made.version == type->tp_version_tag) /* (the type unchanged by any of the lookups) */
		*site = made;
#else
	(void)site;
	for (int i = 0; i < n; i++)
		out[i] = lookup(obj, names[i]);
#endif
}

void fields_read(PyObject *obj, PyObject *const *names, int n, struct fields *site, PyObject **out)
{
#if KNOWN_LAYOUT
	PyDictValues *values = recorded_values(obj, site->type, site->version, site->keys, site->top);
	if (values != NULL) {
		for (int i = 0; i < n; i++) {
			out[i] = values->values[site->index[i]];
			Py_XINCREF(out[i]);
		}
		return;
	}
#endif
	fields_fill(obj, names, n, site, out);
}

int store_attr(PyObject *obj, PyObject *name, PyObject *value)
{
#if KNOWN_LAYOUT
	PyTypeObject *type = Py_TYPE(obj);
	const struct entry *e = entry_of(type, name);
	PyDictValues *values = values_at(obj, type, e);
#if PY_3_13_ONLY
	if (*(((PyObject **)obj) - 3) != NULL) /* a dict made of its values (vars()): it is told of a change */
		values = NULL;
#endif
	if (values != NULL && e->index >= 0 && type->tp_setattro == PyObject_GenericSetAttr) {
		/* as CPython's STORE_ATTR_INSTANCE_VALUE with the name's index known */
		PyObject *old = values->values[e->index];
		Py_INCREF(value);
		values->values[e->index] = value;
		if (old == NULL)
			_PyDictValues_AddToInsertionOrder(values, e->index);
		else
			Py_DECREF(old);
		return 0;
	}
#endif
	return PyObject_SetAttr(obj, name, value);
}

int dict_fill_empty(PyObject *dict, PyObject *model, PyObject *const *keys, PyObject *const *values, Py_ssize_t n)
{
#if KNOWN_LAYOUT
	PyDictObject *mp = (PyDictObject *)model;
	if (mp->ma_used == 0) {
		for (Py_ssize_t i = 0; i < n; i++)
			if (PyDict_SetItem(model, keys[i], values[i])) {
				PyDict_Clear(model); /* filled again next time, not left short of its keys for good */
				return -1;
			}
	} else {
		PyDictKeysObject *k = mp->ma_keys;
		if (mp->ma_values != NULL || k->dk_kind != DICT_KEYS_UNICODE || k->dk_nentries != n || mp->ma_used != n)
			return 0;
		PyDictUnicodeEntry *entries = DK_UNICODE_ENTRIES(k);
		for (Py_ssize_t i = 0; i < n; i++)
			if (entries[i].me_key != keys[i])
				return 0;
		for (Py_ssize_t i = 0; i < n; i++) {
			PyObject *old = entries[i].me_value;
			Py_INCREF(values[i]);
			entries[i].me_value = values[i];
			Py_DECREF(old);
		}
	}
	return PyDict_Update(dict, model) ? -1 : 1;
#else
	return 0;
#endif
}

#if KNOWN_LAYOUT
/* Where a lockobject keeps what locked() returns: 3.11, 3.12 and 3.13 before 3.13.x's
 * PyMutex, `char locked` after the OS lock and the weak reference list; since, the PyMutex
 * (its bit 0: locked). */
static const struct lock_field {
	size_t offset;
	unsigned char mask;
} lock_fields[] = {{sizeof(PyObject) + 2 * sizeof(void *), 0xff}, {sizeof(PyObject), 1}};
static PyTypeObject *probed_lock_type; /* the type whose locks lock_state reads (NULL: none) */
static struct lock_field lock_field;

static inline int held_at(PyObject *lock, struct lock_field f)
{
	return (*((unsigned char *)lock + f.offset) & f.mask) != 0;
}

static int state_is(PyObject *lock, struct lock_field f, int held)
{
	PyObject *said = PyObject_CallMethod(lock, "locked", NULL);
	int agree = said != NULL && (said == Py_True) == held && held_at(lock, f) == held;
	Py_XDECREF(said);
	return agree;
}
#endif

int lock_probe(PyObject *lock)
{
#if KNOWN_LAYOUT
	probed_lock_type = NULL;
	for (size_t i = 0; i < sizeof(lock_fields) / sizeof(lock_fields[0]) && !probed_lock_type; i++) {
		struct lock_field f = lock_fields[i];
		if ((size_t)Py_TYPE(lock)->tp_basicsize <= f.offset || !state_is(lock, f, 0)) {
			if (PyErr_Occurred())
				return -1;
			continue;
		}
		PyObject *r = PyObject_CallMethod(lock, "acquire", NULL);
		Py_XDECREF(r);
		int held = r != NULL && state_is(lock, f, 1);
		r = r != NULL ? PyObject_CallMethod(lock, "release", NULL) : NULL;
		Py_XDECREF(r);
		if (r == NULL)
			return -1;
		if (held && state_is(lock, f, 0)) {
			lock_field = f;
			probed_lock_type = Py_TYPE(lock);
		}
		if (PyErr_Occurred())
			return -1;
	}
	return probed_lock_type != NULL;
#else
	return 0;
#endif
}

int lock_state(PyObject *lock)
{
#if KNOWN_LAYOUT
	if (Py_TYPE(lock) == probed_lock_type)
		return held_at(lock, lock_field);
#endif
	return -1;
}

#if KNOWN_LAYOUT && PyLong_SHIFT == 30
/* An exact int's magnitude (*u) and sign, where it has at most three digits below 2**64: 1, else 0. */
static inline int digits_of(PyObject *v, uint64_t *u, int *negative)
{
	if (!PyLong_CheckExact(v))
		return 0;
#if PY_3_11_ONLY
	Py_ssize_t size = Py_SIZE(v), n = size < 0 ? -size : size;
	*negative = size < 0;
	const digit *d = ((PyLongObject *)v)->ob_digit;
#else
	uintptr_t tag = ((PyLongObject *)v)->long_value.lv_tag;
	Py_ssize_t n = (Py_ssize_t)(tag >> _PyLong_NON_SIZE_BITS);
	*negative = (tag & _PyLong_SIGN_MASK) == 2;
	const digit *d = ((PyLongObject *)v)->long_value.ob_digit;
#endif
	if (n > 3 || (n == 3 && d[2] >= 16))
		return 0;
	*u = (n > 0 ? d[0] : 0) | (n > 1 ? (uint64_t)d[1] << 30 : 0) | (n > 2 ? (uint64_t)d[2] << 60 : 0);
	return 1;
}
#endif

long long_value(PyObject *v, int *ok)
{
#if KNOWN_LAYOUT && PyLong_SHIFT == 30
	uint64_t u;
	int negative;
	if (digits_of(v, &u, &negative) && u <= (uint64_t)LONG_MAX) {
		*ok = 1;
		return negative ? -(long)u : (long)u;
	}
#endif
	long value = PyLong_AsLong(v);
	*ok = !PyErr_Occurred();
	clear_error();
	return value;
}

unsigned long ulong_value(PyObject *v, int *ok)
{
#if KNOWN_LAYOUT && PyLong_SHIFT == 30
	uint64_t u;
	int negative;
	if (digits_of(v, &u, &negative) && (!negative || u == 0)) {
		*ok = 1;
		return u;
	}
#endif
	unsigned long value = PyLong_AsUnsignedLong(v);
	*ok = !PyErr_Occurred();
	clear_error();
	return value;
}

PyObject *long_from(long v)
{
#if KNOWN_LAYOUT && PyLong_SHIFT == 30
	if (v >= 1L << 60) { /* three digits, as _PyLong_New leaves a positive one (its size and sign set) */
		PyLongObject *r = _PyLong_New(3);
		if (r == NULL)
			return NULL;
#if PY_3_11_ONLY
		digit *d = r->ob_digit;
#else
		digit *d = r->long_value.ob_digit;
#endif
		d[0] = (digit)(v & PyLong_MASK);
		d[1] = (digit)((v >> 30) & PyLong_MASK);
		d[2] = (digit)(v >> 60);
		return (PyObject *)r;
	}
#endif
	return PyLong_FromLong(v);
}

/* otel_gil/cpython_layouts.c's lookup, store_attr and dict_fill_empty, callable from Python:
 * the C side of tests/unit/layout_cases.py, which test_cpython_layouts.py compiles for each
 * interpreter (test-only). The file is included, not linked: cached() reads its cache.
 */
#include "cpython_layouts.c"

static PyObject *absent; /* what lookup_attr returns where lookup found nothing */

static PyObject *checks_lookup(PyObject *module, PyObject *args)
{
	PyObject *obj, *name;
	if (!PyArg_ParseTuple(args, "OU", &obj, &name))
		return NULL;
	PyObject *value = lookup(obj, name);
	if (value == NULL && !PyErr_Occurred()) {
		Py_INCREF(absent);
		return absent;
	}
	return value;
}

static PyObject *checks_store(PyObject *module, PyObject *args)
{
	PyObject *obj, *name, *value;
	if (!PyArg_ParseTuple(args, "OUO", &obj, &name, &value) || store_attr(obj, name, value))
		return NULL;
	Py_RETURN_NONE;
}

static PyObject *checks_fill_empty(PyObject *module, PyObject *args)
{
	PyObject *dict, *model, *keys, *values;
	if (!PyArg_ParseTuple(args, "O!O!O!O!", &PyDict_Type, &dict, &PyDict_Type, &model, &PyTuple_Type, &keys,
			      &PyTuple_Type, &values) || PyTuple_GET_SIZE(keys) != PyTuple_GET_SIZE(values))
		return PyErr_Occurred() ? NULL : PyErr_Format(PyExc_ValueError, "as many keys as values");
	int rc = dict_fill_empty(dict, model, &PyTuple_GET_ITEM(keys, 0), &PyTuple_GET_ITEM(values, 0),
				 PyTuple_GET_SIZE(keys));
	return rc < 0 ? NULL : PyLong_FromLong(rc);
}

/* Whether lookup(obj, name) answers from its cache, through the type's layout (no generic lookup). */
static PyObject *checks_cached(PyObject *module, PyObject *args)
{
	PyObject *obj, *name;
	if (!PyArg_ParseTuple(args, "OU", &obj, &name))
		return NULL;
#if KNOWN_LAYOUT
	return PyBool_FromLong(values_at(obj, Py_TYPE(obj), entry_of(Py_TYPE(obj), name)) != NULL);
#else
	Py_RETURN_FALSE;
#endif
}

static PyObject *checks_fields(PyObject *module, PyObject *args)
{
	static struct fields site; /* one call site, as FIELDS() gives each */
	PyObject *obj, *names, *out[FIELDS_MAX];
	if (!PyArg_ParseTuple(args, "OO!", &obj, &PyTuple_Type, &names))
		return NULL;
	Py_ssize_t n = PyTuple_GET_SIZE(names);
	if (n < 1 || n > FIELDS_MAX)
		return PyErr_Format(PyExc_ValueError, "1 to %d names", FIELDS_MAX);
	fields_read(obj, &PyTuple_GET_ITEM(names, 0), (int)n, &site, out);
	PyObject *result = PyErr_Occurred() ? NULL : PyTuple_New(n);
	for (Py_ssize_t i = 0; i < n; i++) {
		PyObject *value = out[i] != NULL ? out[i] : (Py_INCREF(absent), absent);
		if (result != NULL)
			PyTuple_SET_ITEM(result, i, value);
		else
			Py_DECREF(value);
	}
	return result;
}

static PyObject *checks_lock_probe(PyObject *module, PyObject *lock)
{
	int rc = lock_probe(lock);
	return rc < 0 ? NULL : PyLong_FromLong(rc);
}

static PyObject *checks_lock_state(PyObject *module, PyObject *lock)
{
	return PyLong_FromLong(lock_state(lock));
}

static PyObject *checks_long_value(PyObject *module, PyObject *v)
{
	int ok;
	long value = long_value(v, &ok);
	if (PyErr_Occurred())
		return NULL;
	if (ok)
		return PyLong_FromLong(value);
	Py_INCREF(absent);
	return absent;
}

static PyMethodDef methods[] = {
	{"long_value", checks_long_value, METH_O, "long_value(v): v as a C long, ABSENT where PyLong_AsLong fails."},
	{"lock_probe", checks_lock_probe, METH_O, "lock_probe(lock): 1 if lock_state reads locks of its type in place."},
	{"lock_state", checks_lock_state, METH_O, "lock_state(lock): 1 held, 0 free, -1 not read in place."},
	{"cached", checks_cached, METH_VARARGS,
	 "cached(obj, name): lookup(obj, name) reads it through the type's layout (name: an interned str)."},
	{"fill_empty", checks_fill_empty, METH_VARARGS,
	 "fill_empty(dict, model, keys, values): dict_fill_empty's 1 (filled) or 0 (the caller inserts)."},
	{"store", checks_store, METH_VARARGS, "store(obj, name, value): setattr(obj, name, value) as the C span hooks do."},
	{"fields", checks_fields, METH_VARARGS,
	 "fields(obj, names): getattr(obj, name, ABSENT) for each of names (interned strs), read together as the C "
	 "span hooks read them through one call site (this one, for every call)."},
	{"lookup", checks_lookup, METH_VARARGS,
	 "lookup(obj, name): getattr(obj, name, ABSENT) as the C span hooks read it (name: an interned str)."},
	{NULL},
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "layout_checks", NULL, -1, methods};

PyMODINIT_FUNC PyInit_layout_checks(void)
{
	PyObject *m = PyModule_Create(&module_def);
	absent = PyUnicode_InternFromString("<absent>");
	if (m == NULL || absent == NULL || PyModule_AddIntConstant(m, "KNOWN_LAYOUT", KNOWN_LAYOUT))
		return NULL;
	Py_INCREF(absent);
	if (PyModule_AddObject(m, "ABSENT", absent)) {
		Py_DECREF(absent);
		Py_DECREF(m);
		return NULL;
	}
	return m;
}

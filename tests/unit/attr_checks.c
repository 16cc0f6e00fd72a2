/* otel_gil/instance_attrs.c's lookup and store_attr, callable from Python: the C side of
 * tests/unit/test_instance_attrs.py, which compiles this module with it (test-only).
 */
#include "fastspan.h"

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

static PyMethodDef methods[] = {
	{"store", checks_store, METH_VARARGS, "store(obj, name, value): setattr(obj, name, value) as the C span hooks do."},
	{"lookup", checks_lookup, METH_VARARGS,
	 "lookup(obj, name): getattr(obj, name, ABSENT) as the C span hooks read it (name: an interned str)."},
	{NULL},
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "attr_checks", NULL, -1, methods};

PyMODINIT_FUNC PyInit_attr_checks(void)
{
	PyObject *m = PyModule_Create(&module_def);
	absent = PyUnicode_InternFromString("<absent>");
	if (m == NULL || absent == NULL)
		return NULL;
	Py_INCREF(absent);
	if (PyModule_AddObject(m, "ABSENT", absent)) {
		Py_DECREF(absent);
		Py_DECREF(m);
		return NULL;
	}
	return m;
}

/* otel_gil/instance_attrs.c's lookup, callable from Python: the C side of
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

static PyMethodDef methods[] = {
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

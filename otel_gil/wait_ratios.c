/* metrics.WaitRatios' counter in C (RatioCounter): the wait ratio histogram of server
 * spans by route, counted by the span hooks (_fastspan.c) with no Python frame.
 */
#include "fastspan.h"

#include <stddef.h>

/* metrics.WaitRatios' counting in C: a server span's wait ratio into its route's
 * bucket, with no Python frame and no lock (nothing in it releases the GIL, so it
 * is atomic for every other thread, and WaitRatios.rows copies rows whole). */
struct RatioCounter {
	PyObject_HEAD
	vectorcallfunc vectorcall;
	PyObject *table;       /* dict: route -> [count per bucket..., count above the last bound, sum] */
	PyObject *other;       /* where routes beyond max_routes are counted */
	Py_ssize_t max_routes;
	Py_ssize_t nbounds;
	double bounds[32];     /* upper bounds (le) of the buckets, ascending */
};

int count_ratio(RatioCounter *self, PyObject *route, double ratio)
{
	Py_ssize_t bucket = 0; /* bisect_left: the first bound >= ratio */
	while (bucket < self->nbounds && self->bounds[bucket] < ratio)
		bucket++;
	PyObject *row = PyDict_GetItemWithError(self->table, route);
	if (row == NULL) {
		if (PyErr_Occurred())
			return -1;
		if (PyDict_GET_SIZE(self->table) >= self->max_routes)
			route = self->other;
		row = PyDict_GetItemWithError(self->table, route);
		if (row == NULL) {
			if (PyErr_Occurred() || (row = PyList_New(self->nbounds + 2)) == NULL)
				return -1;
			for (Py_ssize_t i = 0; i <= self->nbounds; i++)
				PyList_SET_ITEM(row, i, PyLong_FromLong(0));
			PyList_SET_ITEM(row, self->nbounds + 1, PyFloat_FromDouble(0.0));
			int failed = PyDict_SetItem(self->table, route, row);
			Py_DECREF(row); /* the table holds it */
			if (failed)
				return -1;
		}
	}
	if (!PyList_CheckExact(row) || PyList_GET_SIZE(row) != self->nbounds + 2) {
		PyErr_SetString(PyExc_TypeError, "a WaitRatios row is not a list of the bucket counts and the sum");
		return -1;
	}
	long long counted = PyLong_AsLongLong(PyList_GET_ITEM(row, bucket));
	PyObject *count = counted < 0 ? NULL : PyLong_FromLongLong(counted + 1);
	PyObject *sum = count ? PyFloat_FromDouble(PyFloat_AsDouble(PyList_GET_ITEM(row, self->nbounds + 1)) + ratio) : NULL;
	if (sum == NULL) {
		Py_XDECREF(count);
		return -1;
	}
	PyList_SetItem(row, bucket, count);
	PyList_SetItem(row, self->nbounds + 1, sum);
	return 0;
}

static PyObject *RatioCounter_vectorcall(RatioCounter *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
	double ratio;
	if (PyVectorcall_NARGS(nargsf) != 2 || kwnames != NULL || !PyUnicode_Check(args[1]) ||
	    ((ratio = PyFloat_AsDouble(args[0])) == -1.0 && PyErr_Occurred())) {
		if (!PyErr_Occurred())
			PyErr_SetString(PyExc_TypeError, "counter(ratio: float, route: str)");
		return NULL;
	}
	if (count_ratio(self, args[1], ratio))
		return NULL;
	Py_RETURN_NONE;
}

static int RatioCounter_init(RatioCounter *self, PyObject *args, PyObject *kwds)
{
	static char *kwlist[] = {"table", "bounds", "max_routes", "other", NULL};
	PyObject *table, *bounds, *other;
	Py_ssize_t max_routes;
	if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!nU", kwlist, &PyDict_Type, &table, &PyTuple_Type, &bounds,
					 &max_routes, &other))
		return -1;
	if (PyTuple_GET_SIZE(bounds) > 32) {
		PyErr_SetString(PyExc_ValueError, "at most 32 bucket bounds");
		return -1;
	}
	self->nbounds = PyTuple_GET_SIZE(bounds);
	for (Py_ssize_t i = 0; i < self->nbounds; i++)
		if ((self->bounds[i] = PyFloat_AsDouble(PyTuple_GET_ITEM(bounds, i))) == -1.0 && PyErr_Occurred())
			return -1;
	Py_INCREF(table);
	Py_XSETREF(self->table, table);
	Py_INCREF(other);
	Py_XSETREF(self->other, other);
	self->max_routes = max_routes;
	self->vectorcall = (vectorcallfunc)RatioCounter_vectorcall;
	return 0;
}

static int RatioCounter_traverse(RatioCounter *self, visitproc visit, void *arg)
{
	Py_VISIT(self->table);
	return 0;
}

static int RatioCounter_clear(RatioCounter *self)
{
	Py_CLEAR(self->table);
	Py_CLEAR(self->other);
	return 0;
}

static void RatioCounter_dealloc(RatioCounter *self)
{
	PyObject_GC_UnTrack(self);
	RatioCounter_clear(self);
	Py_TYPE(self)->tp_free((PyObject *)self);
}

PyTypeObject RatioCounterType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "otel_gil._fastspan.RatioCounter",
	.tp_basicsize = sizeof(RatioCounter),
	.tp_dealloc = (destructor)RatioCounter_dealloc,
	.tp_vectorcall_offset = offsetof(RatioCounter, vectorcall),
	.tp_call = PyVectorcall_Call,
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
	.tp_doc = "RatioCounter(table, bounds, max_routes, other)(ratio, route): metrics.WaitRatios.record in C.",
	.tp_traverse = (traverseproc)RatioCounter_traverse,
	.tp_clear = (inquiry)RatioCounter_clear,
	.tp_init = (initproc)RatioCounter_init,
	.tp_new = PyType_GenericNew,
};

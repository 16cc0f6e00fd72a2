/* The span hooks' figures, callable from Python with any input: the C side of the
 * differential test (tests/unit/test_differential.py, which compiles this module on its
 * own, never shipped: slot_counters reads any address), fed the same slots and counters
 * as the Python reference (ring.counters, spans.own_figures).
 */
#include "span_figures.h"

static int counters_from(PyObject *tuple, struct counters *c)
{
	unsigned long long v[5];
	if (!PyArg_ParseTuple(tuple, "KKKKK;counters: (wait_ns, hold_ns, acquisitions, convoy_waits, long_waits)", &v[0],
			      &v[1], &v[2], &v[3], &v[4]))
		return -1;
	*c = (struct counters){v[0], v[1], v[2], v[3], v[4]};
	return 0;
}

static PyObject *checks_span_figures(PyObject *module, PyObject *args)
{
	PyObject *c0_arg, *c1_arg, *own_arg;
	long long duration;
	struct counters c0, c1;
	if (!PyArg_ParseTuple(args, "O!O!OL", &PyTuple_Type, &c0_arg, &PyTuple_Type, &c1_arg, &own_arg, &duration) ||
	    counters_from(c0_arg, &c0) || counters_from(c1_arg, &c1))
		return NULL;
	if (duration < 1) {
		PyErr_SetString(PyExc_ValueError, "duration must be at least 1 ns");
		return NULL;
	}
	struct own own = {0}, *o = NULL;
	int switched = 0, untracked = 0;
	if (own_arg != Py_None) {
		unsigned long long v[6];
		int threads, unseen, broken, not_throughout;
		if (!PyTuple_Check(own_arg) ||
		    !PyArg_ParseTuple(own_arg, "KKKKKKipppp;own: an Own", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &threads,
				      &switched, &unseen, &broken, &not_throughout))
			return PyErr_Occurred() ? NULL : PyErr_Format(PyExc_TypeError, "own: an Own or None");
		own.hold_home = v[0], own.acquisitions_home = v[1], own.wait_else = v[2], own.hold_else = v[3];
		own.acquisitions_else = v[4], own.convoy_else = v[5];
		own.threads_else = threads < 0 ? OWN_MANY : (uint32_t)threads;
		own.flags = (unseen ? OWN_UNSEEN : 0) | (broken ? OWN_BROKEN : 0);
		untracked = not_throughout && (switched || own.threads_else);
		o = &own;
	}
	struct figures f;
	if (!span_figures(&c0, &c1, o, switched, untracked, duration, &f))
		Py_RETURN_NONE;
	return Py_BuildValue("(KKKKK)", (unsigned long long)f.wait, (unsigned long long)f.hold,
			     (unsigned long long)f.acquisitions, (unsigned long long)f.convoy, (unsigned long long)f.others);
}

static PyObject *checks_slot_counters(PyObject *module, PyObject *args)
{
	PyObject *address;
	unsigned long long now;
	if (!PyArg_ParseTuple(args, "O!K", &PyLong_Type, &address, &now))
		return NULL;
	const void *slot = PyLong_AsVoidPtr(address);
	if (slot == NULL) {
		if (!PyErr_Occurred())
			PyErr_SetString(PyExc_ValueError, "address: a struct gil_slot's, not 0");
		return NULL;
	}
	struct counters c;
	slot_counters((const volatile struct gil_slot *)slot, now, &c);
	return Py_BuildValue("(KKKKK)", (unsigned long long)c.wait_ns, (unsigned long long)c.hold_ns,
			     (unsigned long long)c.acquisitions, (unsigned long long)c.convoy_waits,
			     (unsigned long long)c.long_waits);
}

static PyMethodDef methods[] = {
	{"span_figures", checks_span_figures, METH_VARARGS,
	 "span_figures(start, end, own, duration): the hooks' figures of a span whose thread's counters were start "
	 "and end (each (wait_ns, hold_ns, acquisitions, convoy_waits, long_waits)), own an Own or None, duration ns: "
	 "(wait_ns, hold_ns, acquisitions, convoy_waits, others_hold_ns), or None where the Python hook decides."},
	{"slot_counters", checks_slot_counters, METH_VARARGS,
	 "slot_counters(address, now): the counters of the struct gil_slot at address, open intervals closed at now "
	 "(monotonic ns), as the hooks read them."},
	{NULL},
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "figure_checks", NULL, -1, methods};

PyMODINIT_FUNC PyInit_figure_checks(void) { return PyModule_Create(&module_def); }

/* The calling thread's thread.name and thread.id for the span hooks, as spans.py gives
 * them (threading.current_thread()'s name and ident), without a Python frame per span.
 */
#include "fastspan.h"

/* The OS thread's pair in its thread state's dict as last found there (borrowed): valid while
 * that thread state is (ids never reused: of the thread state, of its interpreter) and the
 * ident is (not a fork's child). */
static __thread __attribute__((tls_model("initial-exec"))) struct {
	uint64_t tstate_id;
	int64_t interp_id;
	unsigned long ident;
	PyObject *pair;
} last;

/* threading.current_thread() and its ident (new references), without a Python frame for a
 * threading.Thread: cached in the thread state's dict, which CPython clears as the thread
 * exits; looked up again where the ident changed (a fork's child). */
static PyObject *current_thread(PyObject *threading, PyObject **ident_out, PyThreadState *ts)
{
	unsigned long ident = PyThread_get_thread_ident();
	uint64_t tstate_id = PyThreadState_GetID(ts);
	int64_t interp_id = PyInterpreterState_GetID(PyThreadState_GetInterpreter(ts));
	PyObject *tdict = NULL, *cached = last.pair;
	if (cached == NULL || last.tstate_id != tstate_id || last.interp_id != interp_id || last.ident != ident) {
		tdict = PyThreadState_GetDict(); /* borrowed */
		cached = tdict ? PyDict_GetItemWithError(tdict, s_thread_key) : NULL;
		if (cached && PyTuple_CheckExact(cached) && PyTuple_GET_SIZE(cached) == 2 &&
		    PyLong_AsUnsignedLong(PyTuple_GET_ITEM(cached, 1)) == ident) {
			last.tstate_id = tstate_id;
			last.interp_id = interp_id;
			last.ident = ident;
			last.pair = cached;
		} else {
			cached = NULL;
		}
	}
	if (cached != NULL) {
		PyObject *thread = PyTuple_GET_ITEM(cached, 0);
		*ident_out = PyTuple_GET_ITEM(cached, 1);
		Py_INCREF(*ident_out);
		Py_INCREF(thread);
		return thread;
	}
	PyErr_Clear();
	PyObject *key = PyLong_FromUnsignedLong(ident);
	if (key == NULL)
		return NULL;
	PyObject *active = PyObject_GetAttr(threading, s_active);
	PyObject *thread = active && PyDict_Check(active) ? PyDict_GetItemWithError(active, key) : NULL;
	Py_XINCREF(thread);
	Py_XDECREF(active);
	if (thread == NULL) {
		PyErr_Clear();
		thread = PyObject_CallMethod(threading, "current_thread", NULL);
		if (thread == NULL) {
			Py_DECREF(key);
			return NULL;
		}
	}
	PyObject *pair = tdict ? PyTuple_Pack(2, thread, key) : NULL;
	last.pair = NULL; /* the pair it replaces in the dict goes */
	if (pair == NULL || PyDict_SetItem(tdict, s_thread_key, pair))
		PyErr_Clear();
	Py_XDECREF(pair);
	*ident_out = key;
	return thread;
}

PyObject *thread_name(PyObject *threading, PyObject **ident_out, PyThreadState *ts)
{
	PyObject *thread = current_thread(threading, ident_out, ts);
	if (thread == NULL)
		return NULL;
	PyObject *name = lookup(thread, s_private_name);
	if (name == NULL) {
		PyErr_Clear();
		name = PyObject_GetAttr(thread, s_public_name);
	}
	Py_DECREF(thread);
	if (name == NULL)
		Py_CLEAR(*ident_out);
	return name;
}

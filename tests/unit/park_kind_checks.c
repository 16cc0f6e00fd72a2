/* park_kind() (otel_gil/park_kind.h: the in-process writer's), callable from Python with any
 * address: the C side of the differential test with the collector's parkkinds.py
 * (tests/workloads/park_kinds.py compiles this module on its own, never shipped: it classifies
 * any address). Free-threaded builds; declared safe without a GIL, so importing it leaves it off.
 */
#include "park_kind.h"

#include <dlfcn.h>

static struct park_where where;

/* set_where(tstate_state, ob_mutex, ob_type, lock_mutex, tp_name, stw_runtime, stw_interp,
 * runtime_size, interp_size, lock_types): install_parks()'s arguments of the same names. */
static PyObject *set_where(PyObject *module, PyObject *args)
{
	unsigned long long lock_type, rlock_type;
	(void)module;
	if (!PyArg_ParseTuple(args, "lllllllkk(KK)", &where.tstate_state, &where.ob_mutex, &where.ob_type,
			      &where.lock_mutex, &where.tp_name, &where.stw_runtime, &where.stw_interp,
			      &where.runtime_size, &where.interp_size, &lock_type, &rlock_type))
		return NULL;
	where.runtime = (uintptr_t)dlsym(RTLD_DEFAULT, "_PyRuntime");
	where.interp = (uintptr_t)PyInterpreterState_Main();
	where.lock_types[0] = (uintptr_t)lock_type, where.lock_types[1] = (uintptr_t)rlock_type;
	where.pid = getpid();
	Py_RETURN_NONE;
}

/* park_kind_of(address) -> (kind, type name): a park of the calling thread on it. */
static PyObject *park_kind_of(PyObject *module, PyObject *arg)
{
	(void)module;
	uintptr_t addr = (uintptr_t)PyLong_AsUnsignedLongLong(arg);
	if (PyErr_Occurred())
		return NULL;
	char name[GIL_PARK_TYPE] = {0};
	__u32 kind = park_kind(&where, addr, name);
	return Py_BuildValue("(Iy)", kind, name);
}

static PyMethodDef methods[] = {
	{"set_where", set_where, METH_VARARGS, "What park_kind() tells addresses apart by."},
	{"park_kind_of", park_kind_of, METH_O, "park_kind_of(address) -> (kind, type name)."},
	{NULL, NULL, 0, NULL},
};

static PyModuleDef_Slot slots[] = {
	{Py_mod_gil, Py_MOD_GIL_NOT_USED},
	{0, NULL},
};

static struct PyModuleDef module_def = {
	PyModuleDef_HEAD_INIT,
	.m_name = "park_kind_checks",
	.m_methods = methods,
	.m_slots = slots,
};

PyMODINIT_FUNC PyInit_park_kind_checks(void) { return PyModuleDef_Init(&module_def); }

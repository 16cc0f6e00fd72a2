/* Context switches that extension modules make in C (before 3.14, whose context watchers
 * see every one): uvloop (and rloop, an asyncio loop in Rust) runs each callback and task
 * step between PyContext_Enter and PyContext_Exit, called through its own GOT, where no
 * Context.run hook sees them. Those two GOT entries of each module in `modules` are
 * swapped for wrappers (got_patch.c) that make the same charge point as the Context.run
 * hook (context_switched), when the module is loaded: at track_contexts, as its import
 * ends (hook_loop_modules, from spans.py's post-import hook), else when a span first sees
 * its loop running (check_loop); restored at untrack_contexts. A forked
 * child inherits the patched entries with the rest of its memory, and restores its own.
 *
 * A module whose GOT has no such entries (a static build links it into the interpreter)
 * keeps its switches unseen: its loop's spans say gil.status=shared_thread.
 */
#include "fastspan.h"
#include "got_patch.h"

#include <errno.h>
#include <string.h>

#if !PY_3_14_OR_LATER
static int (*real_enter)(PyObject *), (*real_exit)(PyObject *);

static int enter_hook(PyObject *ctx)
{
	if (real_enter(ctx))
		return -1;
	context_switched();
	return 0;
}

static int exit_hook(PyObject *ctx)
{
	if (real_exit(ctx))
		return -1;
	context_switched();
	return 0;
}

static const struct got_hook hooked[] = {
	{"PyContext_Enter", (void *)enter_hook, (void **)&real_enter},
	{"PyContext_Exit", (void *)exit_hook, (void **)&real_exit},
};

/* The extension modules known to enter contexts in C (README: "Async and greenlet services"). */
static struct module {
	const char *name;    /* as in sys.modules */
	const char *loop;    /* its event loop class (whose running loop's switches are then seen) */
	PyObject *key;       /* name, interned */
	struct got got;
	PyObject *loop_type; /* once its entries were found */
	int hooked;          /* its entries hold the hooks */
	int failed;          /* got.error says why: never tried again */
} modules[] = {
	{"uvloop.loop", "Loop"},
	{"rloop._rloop", "EventLoop"},
};
#define NMODULES (sizeof(modules) / sizeof(modules[0]))

/* Hook one loaded module; 0, or -1 (m->failed: its switches stay unseen). */
static int hook_module(struct module *m, PyObject *module)
{
	PyModuleDef *def = PyModule_GetDef(module); /* static data of the module's ELF object */
	PyErr_Clear();
	if (m->loop_type == NULL) {
		m->loop_type = PyObject_GetAttrString(module, m->loop);
		if (m->loop_type == NULL || !PyType_Check(m->loop_type)) {
			Py_CLEAR(m->loop_type);
			PyErr_Clear();
			snprintf(m->got.error, sizeof(m->got.error), "%s has no class %s", m->name, m->loop);
			m->failed = 1;
			return -1;
		}
	}
	if (def == NULL) {
		snprintf(m->got.error, sizeof(m->got.error), "%s has no module definition to find its ELF object by",
			 m->name);
		m->failed = 1;
		return -1;
	}
	int failed = got_patch(&m->got, hooked, sizeof(hooked) / sizeof(hooked[0]), def);
	if (failed == GOT_ERRNO)
		snprintf(m->got.error, sizeof(m->got.error), "its GOT's page could not be made writable: %s", strerror(errno));
	if (failed) {
		m->failed = 1;
		return -1;
	}
	m->hooked = 1;
	return 0;
}

/* The module `m` if it is loaded (a new reference), else NULL. */
static PyObject *loaded(struct module *m)
{
	if (m->key == NULL && (m->key = PyUnicode_InternFromString(m->name)) == NULL) {
		PyErr_Clear();
		return NULL;
	}
	PyObject *module = PyImport_GetModule(m->key);
	PyErr_Clear();
	return module;
}

void module_switches_hook(void)
{
	for (size_t i = 0; i < NMODULES; i++) {
		struct module *m = &modules[i];
		if (m->hooked || m->failed)
			continue;
		PyObject *module = loaded(m);
		if (module != NULL)
			hook_module(m, module);
		Py_XDECREF(module);
	}
}

int module_switches_loop(PyObject *loop)
{
	module_switches_hook();
	for (size_t i = 0; i < NMODULES; i++)
		if (modules[i].hooked && PyObject_TypeCheck(loop, (PyTypeObject *)modules[i].loop_type))
			return 1;
	return 0;
}

void module_switches_unhook(void)
{
	for (size_t i = 0; i < NMODULES; i++)
		if (modules[i].hooked) {
			got_restore(&modules[i].got);
			modules[i].hooked = 0;
		}
}

PyObject *module_switches_state(PyObject *module, PyObject *unused)
{
	PyObject *out = PyDict_New();
	for (size_t i = 0; out != NULL && i < NMODULES; i++) {
		struct module *m = &modules[i];
		PyObject *entries = PyList_New(0);
		for (int e = 0; entries != NULL && e < m->got.n; e++) {
			const struct got_entry *g = &m->got.entries[e];
			PyObject *row = Py_BuildValue("{s:s,s:k,s:O}", "symbol", g->hooked->symbol, "address",
						      (unsigned long)(uintptr_t)g->address, "hooked",
						      *g->address == g->hooked->hook ? Py_True : Py_False);
			if (row == NULL || PyList_Append(entries, row))
				Py_CLEAR(entries);
			Py_XDECREF(row);
		}
		PyObject *state = entries == NULL ? NULL : Py_BuildValue(
			"{s:O,s:N,s:s,s:s}", "hooked", m->hooked ? Py_True : Py_False, "entries", entries,
			"object", m->got.object, "error", m->failed ? m->got.error : "");
		if (state == NULL || PyDict_SetItemString(out, m->name, state))
			Py_CLEAR(out);
		Py_XDECREF(state);
	}
	return out;
}
#else
void module_switches_hook(void) {}

int module_switches_loop(PyObject *loop) { return 0; }

void module_switches_unhook(void) {}

PyObject *module_switches_state(PyObject *module, PyObject *unused) { return PyDict_New(); }
#endif

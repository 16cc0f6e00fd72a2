/* What the address a thread parks on belongs to (GIL_PARK_*), from inside the process: the
 * in-process writer's classification (_inprocess.c), here so that the differential test's
 * module (tests/unit/park_kind_checks.c) compiles the very same code. Its twin from outside
 * the process is the collector's otel_gil_collector/parkkinds.py (tests/workloads/park_kinds.py
 * feeds both the same addresses). Free-threaded builds only.
 */
#ifndef OTEL_GIL_PARK_KIND_H
#define OTEL_GIL_PARK_KIND_H

#include <Python.h>
#include <linux/types.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "gil_layout.h"

/* Where this CPython keeps what a park's address is told apart by (otel_gil/pystructs.py's
 * PARKING row; offsets in bytes, -1: none), and this process's runtime and lock types. */
struct park_where {
	long tstate_state;  /* PyThreadState.state */
	long ob_mutex, ob_type, lock_mutex, tp_name;
	long stw_runtime, stw_interp; /* stoptheworld.stop_event in _PyRuntime, PyInterpreterState */
	uintptr_t runtime, runtime_size, interp, interp_size;
	uintptr_t lock_types[2];        /* _thread.lock, _thread.RLock: the app's locks */
	pid_t pid;                      /* this process (after a fork: the child) */
};

/* A read of this process's memory that fails instead of faulting (the address may be anything). */
static int safe_read(const struct park_where *w, void *dst, size_t n, uintptr_t src)
{
	struct iovec local = {dst, n}, remote = {(void *)src, n};
	return syscall(SYS_process_vm_readv, w->pid, &local, 1, &remote, 1, 0) == (long)n ? 0 : -1;
}

static uintptr_t safe_word(const struct park_where *w, uintptr_t src)
{
	uintptr_t word = 0;
	return safe_read(w, &word, sizeof(word), src) == 0 ? word : 0;
}

/* The object at `op` has a type whose type is `type` or a metaclass of it: its name into `name`. */
static int object_type(const struct park_where *w, uintptr_t op, char *name)
{
	uintptr_t type = safe_word(w, op + w->ob_type), meta = type ? safe_word(w, type + w->ob_type) : 0;
	if (!meta || (meta != (uintptr_t)&PyType_Type && safe_word(w, meta + w->ob_type) != (uintptr_t)&PyType_Type))
		return 0;
	uintptr_t tp_name = safe_word(w, type + w->tp_name);
	if (!tp_name || safe_read(w, name, GIL_PARK_TYPE - 1, tp_name) != 0)
		name[0] = 0; /* an object all the same: its name unread */
	return 1;
}

static inline int in(uintptr_t addr, uintptr_t base, uintptr_t size) { return addr - base < size; }

/* What the address the calling thread parks on belongs to, in this order: its own state
 * (suspended for a stop-the-world), a stop-the-world's event (its requester waits for the
 * others), the runtime's or main interpreter's other fields, a threading.Lock's mutex, an
 * object's ob_mutex (a critical section; its type's name into `name`), else other. */
static __u32 park_kind(const struct park_where *w, uintptr_t addr, char *name)
{
	PyThreadState *tstate = PyThreadState_GetUnchecked();
	if (tstate != NULL && addr == (uintptr_t)tstate + w->tstate_state)
		return GIL_PARK_STW;
	if ((w->stw_runtime >= 0 && addr == w->runtime + w->stw_runtime) ||
	    (w->stw_interp >= 0 && addr == w->interp + w->stw_interp))
		return GIL_PARK_STW;
	if (in(addr, w->runtime, w->runtime_size) || in(addr, w->interp, w->interp_size))
		return GIL_PARK_INTERNAL;
	if ((addr - w->lock_mutex) % 8 == 0) {
		uintptr_t type = safe_word(w, addr - w->lock_mutex + w->ob_type);
		if (type && (type == w->lock_types[0] || type == w->lock_types[1]))
			return GIL_PARK_APP_LOCK;
	}
	if ((addr - w->ob_mutex) % 8 == 0 && object_type(w, addr - w->ob_mutex, name))
		return GIL_PARK_OBJECT;
	return GIL_PARK_OTHER;
}

#endif

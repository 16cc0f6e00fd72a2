"""The one table of CPython struct offsets (otel_gil/pystructs.py) against each interpreter's
own headers: every build of the matrix compiles them and prints what its row must say (3.14t
and 3.15t, of which there is no build here: sid's 3.14 and 3.15 headers compiled free-threaded),
the positions in _Py_DebugOffsets on 3.13+ included (on a free-threaded build: its own row, the
positions that say whether its GIL is on, and its PARKING row)."""

import subprocess

import pytest

from helpers import free_threaded_interpreters, matrix_names
from otel_gil import pystructs

# offsetof() of every field of a row, compiled against the interpreter's own headers.
_STRUCTS_C = r"""
#define Py_BUILD_CORE 1
#include <Python.h>
#include <internal/pycore_runtime.h>
#include <internal/pycore_interp.h>
#include <internal/pycore_object.h>
#ifdef Py_GIL_DISABLED
#include <internal/pycore_llist.h>
#include <internal/pycore_semaphore.h>
#endif
#if PY_VERSION_HEX >= 0x030E0000
#include <internal/pycore_interpframe_structs.h>
#elif PY_VERSION_HEX >= 0x030B0000
#include <internal/pycore_frame.h>
#else
#include <frameobject.h>
#endif
#if PY_VERSION_HEX >= 0x030E0000
#include <internal/pycore_debug_offsets.h>
#endif
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#define P(name, value) printf("%s %ld\n", name, (long)(value))
#define D(ours, theirs) printf("debug.%s %zu\n", ours, offsetof(_Py_DebugOffsets, theirs))
int main(void) {
    P("minor", PY_MINOR_VERSION);
#ifdef Py_GIL_DISABLED
    P("free_threaded", 1);
    printf("gil_enabled_debug %zu,%zu\n", offsetof(_Py_DebugOffsets, interpreter_state.ceval_gil),
           offsetof(_Py_DebugOffsets, interpreter_state.gil_runtime_state_enabled));
    /* pystructs.PARKING; struct wait_entry as Python/parking_lot.c (3.13-3.15) and lockobject
     * as Modules/_threadmodule.c have them (the parks' ground truths check both on 3.13t) */
    struct wait_entry { void *park_arg; uintptr_t addr; _PySemaphore sema; struct llist_node node; bool is_unparking; };
    typedef struct { PyObject_HEAD PyMutex lock; } lockobject;
    printf("parking %ld,%zu,%zu,%zu,%zu,%zu,%zu,%zu\n",
           (long)offsetof(struct wait_entry, addr) - (long)offsetof(struct wait_entry, sema),
           offsetof(PyThreadState, state), offsetof(PyObject, ob_mutex),
           offsetof(PyObject, ob_type), offsetof(lockobject, lock), offsetof(PyTypeObject, tp_name),
           offsetof(_PyRuntimeState, stoptheworld.stop_event), offsetof(PyInterpreterState, stoptheworld.stop_event));
    printf("debug_positions %zu,%zu,%zu,%zu\n", offsetof(_Py_DebugOffsets, runtime_state.size),
           offsetof(_Py_DebugOffsets, interpreter_state.size), offsetof(_Py_DebugOffsets, interpreter_state.threads_head),
           offsetof(_Py_DebugOffsets, thread_state.next));
#else
    P("free_threaded", 0);
#endif
    P("ob_type", offsetof(PyObject, ob_type));
    P("gil_last_holder", (long)offsetof(struct _gil_runtime_state, last_holder) - (long)offsetof(struct _gil_runtime_state, cond));
#if PY_VERSION_HEX >= 0x030D0000
    P("tstate_frame", offsetof(PyThreadState, current_frame));
    P("cframe_frame", -1);
#elif PY_VERSION_HEX >= 0x030B0000
    P("tstate_frame", offsetof(PyThreadState, cframe));
    P("cframe_frame", offsetof(_PyCFrame, current_frame));
#else
    P("tstate_frame", offsetof(PyThreadState, frame));
    P("cframe_frame", -1);
#endif
#if PY_VERSION_HEX >= 0x030B0000
    P("frame_previous", offsetof(_PyInterpreterFrame, previous));
#if PY_VERSION_HEX >= 0x030D0000
    P("frame_code", offsetof(_PyInterpreterFrame, f_executable));
    P("frame_instr", offsetof(_PyInterpreterFrame, instr_ptr));
#else
    P("frame_code", offsetof(_PyInterpreterFrame, f_code));
    P("frame_instr", offsetof(_PyInterpreterFrame, prev_instr));
#endif
    P("frame_owner", offsetof(_PyInterpreterFrame, owner));
    P("code_name", offsetof(PyCodeObject, co_qualname));
    P("code_code", offsetof(PyCodeObject, co_code_adaptive));
    P("code_firsttraceable", offsetof(PyCodeObject, _co_firsttraceable));
#else
    P("frame_previous", offsetof(PyFrameObject, f_back));
    P("frame_code", offsetof(PyFrameObject, f_code));
    P("frame_instr", offsetof(PyFrameObject, f_lasti));
    P("frame_owner", -1);
    P("code_name", offsetof(PyCodeObject, co_name));
    P("code_code", -1);
    P("code_firsttraceable", -1);
#endif
    P("code_filename", offsetof(PyCodeObject, co_filename));
    P("code_firstlineno", offsetof(PyCodeObject, co_firstlineno));
#if PY_VERSION_HEX >= 0x030A0000
    P("code_linetable", offsetof(PyCodeObject, co_linetable));
#else
    P("code_linetable", offsetof(PyCodeObject, co_lnotab));
#endif
    P("bytes_size", offsetof(PyVarObject, ob_size));
    P("bytes_data", offsetof(PyBytesObject, ob_sval));
    P("str_length", offsetof(PyASCIIObject, length));
    P("str_state", offsetof(PyASCIIObject, state));
    P("str_ascii_data", sizeof(PyASCIIObject));
    P("str_compact_data", sizeof(PyCompactUnicodeObject));
    /* threadnames */
    P("interpreters_head", offsetof(_PyRuntimeState, interpreters.head));
    P("interpreters_main", offsetof(_PyRuntimeState, interpreters.main));
#if PY_VERSION_HEX >= 0x030C0000
    P("modules", offsetof(PyInterpreterState, imports.modules));
#else
    P("modules", offsetof(PyInterpreterState, modules));
#endif
    P("cached_keys", offsetof(PyHeapTypeObject, ht_cached_keys));
#ifdef MANAGED_DICT_OFFSET
    P("managed_dict", MANAGED_DICT_OFFSET);
#else
    P("managed_dict", -3 * (long)sizeof(PyObject *)); /* 3.12's _PyObject_DictOrValuesPointer; none before 3.11 */
#endif
#if PY_VERSION_HEX >= 0x030D0000
    D("interpreters_head", runtime_state.interpreters_head);
    D("tstate_frame", thread_state.current_frame);
    D("frame_previous", interpreter_frame.previous);
    D("frame_code", interpreter_frame.executable);
    D("frame_instr", interpreter_frame.instr_ptr);
    D("frame_owner", interpreter_frame.owner);
    D("code_name", code_object.qualname);
    D("code_filename", code_object.filename);
    D("code_firstlineno", code_object.firstlineno);
    D("code_linetable", code_object.linetable);
    D("code_code", code_object.co_code_adaptive);
    D("str_length", unicode_object.length);
    D("str_state", unicode_object.state);
    D("str_ascii_data", unicode_object.asciiobject_size);
    D("bytes_size", bytes_object.ob_size);
    D("bytes_data", bytes_object.ob_sval);
#endif
    return 0;
}
"""
_COMPILE = """set -e
include=$("$0" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
out=$(mktemp)
gcc -w $1 -x c -I"$include" -I"$include/internal" -o "$out" -
"$out"
rm -f "$out"
"""
FREE_THREADED = free_threaded_interpreters()
# Each build once (containers share their tree's files), the free-threaded ones too.
BUILDS = [name for name in matrix_names() if not name.endswith("-container")] + sorted(FREE_THREADED)


# Debian ships no free-threaded 3.14t or 3.15t (nor can they be built here): their rows are
# what sid's 3.14 and 3.15 headers say when compiled as a free-threaded build's (untested).
HEADERS_ONLY = ["sid-3.14-chroot", "sid-3.15-chroot"]


def _facts(runner, cflags: str = "") -> dict[str, str]:
    done = subprocess.run([*runner.prefix, "sh", "-c", _COMPILE, runner.python, cflags], input=_STRUCTS_C,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"compiling against {runner.python}'s headers failed (python3.X-dev?):\n{done.stderr}"
    return dict(line.split() for line in done.stdout.splitlines())


def _check(facts: dict[str, str]) -> None:
    """The row (and, free-threaded, the GIL's and parking's) of the build ``facts`` describe."""
    version, free_threaded = (3, int(facts.pop("minor"))), facts.pop("free_threaded") == "1"
    row = pystructs.for_version(version, free_threaded)
    assert row is not None
    if free_threaded:
        assert pystructs.GIL_ENABLED_DEBUG[version] == tuple(int(p) for p in facts.pop("gil_enabled_debug").split(","))
        parking = pystructs.PARKING[version]
        assert (parking.entry_addr, parking.tstate_state, parking.ob_mutex, parking.ob_type, parking.lock_mutex,
                parking.tp_name, parking.stw_runtime, parking.stw_interp) == \
            tuple(int(p) for p in facts.pop("parking").split(","))
        assert (pystructs.DEBUG_RUNTIME_SIZE, pystructs.DEBUG_INTERP_SIZE, pystructs.DEBUG_THREADS_HEAD,
                parking.debug_tstate_next) == tuple(int(p) for p in facts.pop("debug_positions").split(","))
    debug = {key[len("debug."):]: int(value) for key, value in facts.items() if key.startswith("debug.")}
    assert row.debug == debug
    for key, value in facts.items():
        if not key.startswith("debug."):
            assert getattr(row, key) == int(value), key


@pytest.mark.parametrize("name", BUILDS)
def test_the_row_matches_the_headers(matrix_runner, name):
    _check(_facts(FREE_THREADED.get(name) or matrix_runner(name)))


@pytest.mark.parametrize("name", HEADERS_ONLY)
def test_the_untested_free_threaded_rows_match_their_headers(matrix_runner, name):
    facts = _facts(matrix_runner(name), "-DPy_GIL_DISABLED=1")
    assert facts["free_threaded"] == "1", facts
    _check(facts)

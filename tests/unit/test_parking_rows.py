"""pystructs' free-threaded rows (FREE_THREADED, PARKING, GIL_ENABLED_DEBUG) against each other
and the default build's, version by version: what a free-threaded object's 32-byte header
implies for the other fields. Against the headers themselves: tests/integration/test_pystructs.py
(3.14t and 3.15t from their headers only: no such build here)."""

from __future__ import annotations

import pytest

from otel_gil import pystructs

VERSIONS = sorted(pystructs.PARKING)
OBJECT_FIELDS = ("bytes_size", "bytes_data", "str_length", "str_state", "str_ascii_data", "str_compact_data")


def test_every_free_threaded_version_has_all_its_rows():
    assert VERSIONS == sorted(pystructs.FREE_THREADED) == sorted(pystructs.GIL_ENABLED_DEBUG)
    assert (3, 14) in VERSIONS and (3, 15) in VERSIONS


@pytest.mark.parametrize("version", VERSIONS)
def test_the_object_header_places_the_object_fields(version):
    row, ft, default = pystructs.PARKING[version], pystructs.FREE_THREADED[version], pystructs.STRUCTS[version]
    head = ft.ob_type + 8  # PyObject ends with ob_type
    assert row.ob_type == ft.ob_type > default.ob_type
    assert 8 <= row.ob_mutex < row.ob_type  # after ob_tid, inside the header
    assert row.lock_mutex == head  # lockobject: PyObject_HEAD, then its PyMutex
    assert row.tp_name == ft.bytes_size + 8 == head + 8  # PyVarObject's ob_size, then tp_name
    moved = ft.ob_type - default.ob_type
    assert {name: getattr(ft, name) - getattr(default, name) for name in OBJECT_FIELDS} == dict.fromkeys(OBJECT_FIELDS, moved)
    assert ft.managed_dict == default.managed_dict + 16  # no GC header before a free-threaded object


@pytest.mark.parametrize("version", VERSIONS)
def test_the_thread_and_runtime_fields_are_consistent(version):
    row, ft, default = pystructs.PARKING[version], pystructs.FREE_THREADED[version], pystructs.STRUCTS[version]
    assert ft.debug == default.debug  # _Py_DebugOffsets is laid out alike on both builds
    assert row.entry_addr == -8  # struct wait_entry: the address parked on is the word before the semaphore
    assert 0 < row.tstate_state < ft.tstate_frame  # PyThreadState: state before current_frame
    assert row.stw_runtime > ft.interpreters_main  # _PyRuntimeState: stoptheworld after interpreters
    assert row.debug_tstate_next > pystructs.DEBUG_THREADS_HEAD > pystructs.DEBUG_INTERP_SIZE > pystructs.DEBUG_RUNTIME_SIZE
    enabled = pystructs.GIL_ENABLED_DEBUG[version]
    assert pystructs.DEBUG_INTERP_SIZE < enabled[0] < enabled[1] < row.debug_tstate_next

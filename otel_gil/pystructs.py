"""Where CPython keeps what otel-gil reads in its memory, per version: the one table.

Both writers of the slot layout read the releasing thread's Python frames through
these offsets (a logged hold's location: ``struct gil_py_layout`` in
gil_layout.h, filled from a row here by whoever creates the ring), and the root
tools read ``threading``'s thread names through them
(``otel_gil_collector.threadnames``). Rows are for release builds with a GIL on
64-bit Linux; ``tests/integration/test_pystructs.py`` compiles each interpreter's
own headers and checks its row field by field, and on 3.13+ a process's own
``_Py_DebugOffsets`` must agree with its row before either writer uses it
(:func:`debug_offsets_disagree`). Free-threaded builds (``python3.13t``+) have rows of their
own: their object header is longer (:data:`FREE_THREADED`).
"""

from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass, field
from typing import Callable, Optional

from otel_gil import ring


@dataclass(frozen=True)
class Structs:
    """One CPython version's offsets (bytes from the start of the struct named; -1: no such field)."""

    # How frames and line tables work in this version (gil_layout.h: GIL_FRAME_*, GIL_LINES_*).
    frame_kind: int
    line_format: int
    lasti_scale: int  # GIL_FRAME_OBJECT: bytes of code per f_lasti unit
    code_tag_bits: int  # low tag bits of the frame's code reference (_PyStackRef)
    skip_owner: int  # frames owned by this or higher are the interpreter's own
    # Offsets, as struct gil_py_layout names them.
    gil_last_holder: int
    tstate_frame: int
    cframe_frame: int
    frame_previous: int
    frame_code: int
    frame_instr: int
    frame_owner: int
    code_name: int
    code_filename: int
    code_firstlineno: int
    code_linetable: int
    code_code: int
    code_firsttraceable: int
    bytes_size: int
    bytes_data: int
    str_length: int
    str_state: int
    str_ascii_data: int
    str_compact_data: int
    # Thread names: _PyRuntimeState.interpreters.head, PyInterpreterState.(imports.)modules,
    # PyHeapTypeObject.ht_cached_keys.
    interpreters_head: int
    modules: int
    cached_keys: int
    # 3.13+: where _Py_DebugOffsets (at the start of _PyRuntime) keeps each field above that it has.
    debug: dict[str, int] = field(default_factory=dict, hash=False)
    ob_type: int = 8  # PyObject.ob_type
    managed_dict: int = -24  # 3.11+: an instance's managed __dict__ pointer, from the object (MANAGED_DICT_OFFSET)

    @property
    def interpreters_main(self) -> int:
        """_PyRuntimeState.interpreters.main (the main interpreter; head is the newest): the
        pointer after head in every version (struct pyinterpreters: mutex, head, main)."""
        return self.interpreters_head + 8


_OBJECT, _INTERP = ring.FRAME_OBJECT, ring.FRAME_INTERP
_LNOTAB, _PAIRS, _LOCATIONS = ring.LINES_LNOTAB, ring.LINES_PAIRS, ring.LINES_LOCATIONS
_DEBUG_FIELDS = ("interpreters_head", "tstate_frame", "frame_previous",
                 "frame_code", "frame_instr", "frame_owner", "code_name", "code_filename", "code_firstlineno",
                 "code_linetable", "code_code", "str_length", "str_state", "str_ascii_data", "bytes_size", "bytes_data")


def _debug(*positions: int) -> dict[str, int]:
    return dict(zip(_DEBUG_FIELDS, positions))


STRUCTS: dict[tuple[int, int], Structs] = {
    (3, 9): Structs(_OBJECT, _LNOTAB, 1, 0, 0, -24, 24, -1,
                    24, 32, 104, -1, 112, 104, 40, 120, -1, -1, 16, 32, 16, 32, 48, 72, 32, 856, 864),
    (3, 10): Structs(_OBJECT, _PAIRS, 2, 0, 0, -24, 24, -1,
                     24, 32, 96, -1, 112, 104, 40, 120, -1, -1, 16, 32, 16, 32, 48, 72, 32, 856, 872),
    (3, 11): Structs(_INTERP, _LOCATIONS, 0, 0, 3, -24, 56, 8,
                     48, 32, 56, 69, 128, 112, 72, 136, 184, 168, 16, 32, 16, 32, 48, 72, 40, 888, 872),
    (3, 12): Structs(_INTERP, _LOCATIONS, 0, 0, 3, -24, 56, 0,
                     8, 0, 56, 70, 128, 112, 68, 136, 192, 176, 16, 32, 16, 32, 40, 56, 40, 944, 880),
    (3, 13): Structs(_INTERP, _LOCATIONS, 0, 0, 3, -24, 72, -1, 8, 0, 56, 70, 128, 112, 68, 136, 200, 184, 16, 32, 16, 32, 40, 56, 632, 7656, 880,
                     _debug(40, 184, 232, 240, 248, 264, 296, 280, 312, 304, 344, 552, 544, 560, 520, 528)),
    (3, 14): Structs(_INTERP, _LOCATIONS, 0, 1, 3, -24, 72, -1, 8, 0, 56, 74, 128, 112, 68, 136, 208, 192, 16, 32, 16, 32, 40, 56, 808, 7688, 880,
                     _debug(40, 208, 256, 264, 272, 288, 336, 320, 352, 344, 384, 632, 624, 640, 600, 608)),
    (3, 15): Structs(_INTERP, _LOCATIONS, 0, 3, 3, -24, 72, -1, 8, 0, 56, 74, 128, 112, 68, 136, 208, 192, 16, 32, 16, 32, 40, 56, 936, 7592, 888,
                     _debug(40, 208, 320, 328, 336, 352, 400, 384, 416, 408, 448, 728, 720, 736, 696, 704)),
}

# Free-threaded builds (Py_GIL_DISABLED): a PyObject of 32 bytes (ob_tid, ob_mutex, ob_gc_bits,
# ob_ref_local, ob_ref_shared before ob_type) moves every object's fields by 16, and no GC
# header precedes an object (its managed __dict__ is just before it); the frames' and
# _Py_DebugOffsets' own layouts are the default build's.
FREE_THREADED: dict[tuple[int, int], Structs] = {
    (3, 13): Structs(_INTERP, _LOCATIONS, 0, 0, 3, -24, 72, -1, 8, 0, 56, 70, 144, 128, 84, 152, 216, 200, 32, 48, 32, 48, 56, 72, 632, 7664, 896,
                     STRUCTS[(3, 13)].debug, ob_type=24, managed_dict=-8),
    # 3.14t, 3.15t: from CPython 3.14.10's and 3.15.2's headers compiled with Py_GIL_DISABLED
    # (no such build here: untested, README "Free-threaded builds"); tlbc_index moves frame_owner.
    (3, 14): Structs(_INTERP, _LOCATIONS, 0, 1, 3, -24, 72, -1, 8, 0, 56, 78, 144, 128, 84, 152, 232, 208, 32, 48, 32, 48, 56, 72, 808, 7712, 896,
                     STRUCTS[(3, 14)].debug, ob_type=24, managed_dict=-8),
    (3, 15): Structs(_INTERP, _LOCATIONS, 0, 3, 3, -24, 72, -1, 8, 0, 56, 78, 144, 128, 84, 152, 232, 208, 32, 48, 32, 48, 56, 72, 936, 7592, 904,
                     STRUCTS[(3, 15)].debug, ob_type=24, managed_dict=-8),
}

DEBUG_COOKIE = b"xdebugpy"  # _Py_DebugOffsets starts with it (3.13+)
DEBUG_FREE_THREADED = 16  # _Py_DebugOffsets.free_threaded: 1 on a free-threaded build
# Where _Py_DebugOffsets keeps what says whether a free-threaded build's GIL is on:
# (interpreter_state.ceval_gil, gil_runtime_state_enabled), offsets into PyInterpreterState
# and struct _gil_runtime_state.
GIL_ENABLED_DEBUG: dict[tuple[int, int], tuple[int, int]] = {(3, 13): (112, 128), (3, 14): (120, 136), (3, 15): (120, 136)}
_U64 = struct.Struct("<Q")
Read = Callable[[int, int], bytes]  # read(address, size): a process's memory


def own_runtime() -> Optional[int]:
    """This process's ``_PyRuntime`` address, None where the interpreter does not export it."""
    try:
        return ctypes.addressof(ctypes.c_char.in_dll(ctypes.pythonapi, "_PyRuntime"))
    except ValueError:
        return None


def read_own(address: int, size: int) -> bytes:
    """``Read`` of this process (the caller knows the address is mapped)."""
    return ctypes.string_at(address, size)


def gil_enabled_address(version: tuple[int, int], runtime: int, read: Read) -> Optional[int]:
    """Where a free-threaded build keeps its main interpreter's ``struct _gil_runtime_state.enabled``
    (an int: INT_MAX once the GIL is on for good), given its ``_PyRuntime``; None where this table
    and the build's own _Py_DebugOffsets do not say (a default build, an unknown version)."""
    structs, positions = for_version(version, True), GIL_ENABLED_DEBUG.get(tuple(version[:2]))

    def u64(address: int) -> int:
        return _U64.unpack(read(address, 8))[0]

    if structs is None or positions is None or debug_offsets_disagree(structs, lambda at, size: read(runtime + at, size)) \
            or not u64(runtime + DEBUG_FREE_THREADED):
        return None
    ceval_gil, enabled = (u64(runtime + position) for position in positions)
    return u64(u64(runtime + structs.interpreters_main) + ceval_gil) + enabled


def for_version(version: tuple[int, int], free_threaded: bool = False) -> Optional[Structs]:
    return (FREE_THREADED if free_threaded else STRUCTS).get(tuple(version[:2]))


def build_name(version: tuple[int, int], free_threaded: bool = False) -> str:
    """``CPython 3.13``, ``free-threaded CPython 3.13t``: what a message calls a build."""
    return f"free-threaded CPython {version[0]}.{version[1]}t" if free_threaded else f"CPython {version[0]}.{version[1]}"


def debug_offsets_disagree(structs: Structs, read: Callable[[int, int], bytes]) -> Optional[str]:
    """Why a process's own _Py_DebugOffsets contradict ``structs`` (a build configured
    otherwise moves the structs), or None if they agree; ``read(position, size)`` reads
    ``_PyRuntime``'s bytes. Rows before 3.13 have nothing to check against."""
    if not structs.debug:
        return None
    if read(0, len(DEBUG_COOKIE)) != DEBUG_COOKIE:
        return "_PyRuntime does not start with _Py_DebugOffsets"
    for name, position in structs.debug.items():
        theirs = _U64.unpack(read(position, 8))[0]
        if theirs != getattr(structs, name):
            return f"this build's _Py_DebugOffsets put {name} at {theirs}, the table at {getattr(structs, name)}"
    return None


def py_layout(version: tuple[int, int], code_type: int, str_type: int, bytes_type: int,
              free_threaded: bool = False) -> ring.PyLayout:
    """The ``header.py`` of a ring for CPython ``version`` (``minor`` 0, no locations, if it
    has no row), given where ``PyCode_Type``, ``PyUnicode_Type`` and ``PyBytes_Type`` are."""
    layout = ring.PyLayout()
    structs = for_version(version, free_threaded)
    if structs is None:
        return layout
    for name, _ in ring.PyLayout._fields_:
        if hasattr(structs, name):
            setattr(layout, name, getattr(structs, name))
    layout.minor = version[1]
    layout.code_type, layout.str_type, layout.bytes_type = code_type, str_type, bytes_type
    return layout


@dataclass(frozen=True)
class Parking:
    """What tells a free-threaded build's parks apart (README, "Free-threaded builds", "Parked
    time"), for the in-process writer's park hooks (``_inprocess.install_parks``): offsets in
    bytes (-1: none)."""

    entry_addr: int  # Python/parking_lot.c: &wait_entry.addr - &wait_entry.sema (the sem_t slept on)
    tstate_state: int  # PyThreadState.state: a thread suspended for a stop-the-world parks on it
    ob_mutex: int  # PyObject.ob_mutex: a critical section's lock
    ob_type: int  # PyObject.ob_type
    lock_mutex: int  # Modules/_threadmodule.c: lockobject.lock (the PyMutex of a threading.Lock)
    tp_name: int  # PyTypeObject.tp_name
    stw_runtime: int  # _PyRuntimeState.stoptheworld.stop_event: a global stop-the-world's requester waits on it
    stw_interp: int  # PyInterpreterState.stoptheworld.stop_event: ... an interpreter's
    debug_tstate_next: int  # where _Py_DebugOffsets keeps thread_state.next (the collector's walk)


# Free-threaded builds only, from their headers (tests/integration/test_pystructs.py): 3.13t's
# CPython 3.13.5's (sid's 3.13.18 headers put stw_runtime at 10364); 3.14t's and 3.15t's
# CPython 3.14.10's and 3.15.2's (untested: no such build here).
PARKING: dict[tuple[int, int], Parking] = {
    (3, 13): Parking(-8, 40, 10, 24, 32, 40, 10340, 10748, 168),
    (3, 14): Parking(-8, 44, 10, 24, 32, 40, 10556, 10852, 192),
    (3, 15): Parking(-8, 48, 10, 24, 32, 40, 10676, 10804, 192),
}
# _Py_DebugOffsets positions (3.13+) of runtime_state.size and interpreter_state.size: a park
# on an address inside _PyRuntime or the main PyInterpreterState is the interpreter's own.
DEBUG_RUNTIME_SIZE, DEBUG_INTERP_SIZE = 24, 48
# ... of interpreter_state.threads_head: the collector walks the thread states (through
# Parking.debug_tstate_next) for a park on one's state (a stop-the-world; in-process, the parker's own).
DEBUG_THREADS_HEAD = 72
# The app's locks' types (Modules/_threadmodule.c): the collector tells them by tp_name.
LOCK_TYPE_NAMES = (b"_thread.lock", b"_thread.RLock")

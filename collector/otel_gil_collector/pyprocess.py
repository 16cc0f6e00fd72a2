"""A CPython process seen from outside, as root: which CPython its interpreter is, where it
is loaded, and its memory, read-only (``/proc/<pid>/mem``: the process is never stopped or
written to). Its memory is input we do not trust and may change under us: every read is
bounded and any inconsistency ends in :class:`Unreadable`, whose message says why.
"""

from __future__ import annotations

import os
import re
import struct
from typing import Optional, Sequence

from otel_gil import pystructs
from otel_gil import ring as ringlib
from otel_gil_collector import elf

READ_BUDGET = 16 << 20  # bytes per Memory: a hostile process cannot keep a root tool busy
_PYTHON_VERSION = re.compile(r"python3\.(\d+)(t?)(?!\d)")
_Q = struct.Struct("<Q")
_TYPES = ("PyCode_Type", "PyUnicode_Type", "PyBytes_Type")  # what a location's reads type-check


class Unreadable(Exception):
    """What was asked cannot be read from this process; the message says why."""


class Memory:
    """Reads of a process's memory through /proc/<pid>/mem (read-only), within a budget;
    a read that cannot be made raises :class:`Unreadable`."""

    def __init__(self, pid: int) -> None:
        self._budget = READ_BUDGET
        try:
            self._fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise Unreadable(f"cannot open /proc/{pid}/mem: {exc.strerror}") from None

    def close(self) -> None:
        os.close(self._fd)

    def read(self, address: int, size: int) -> bytes:
        self._budget -= size
        if self._budget < 0:
            raise Unreadable(f"more than {READ_BUDGET >> 20} MiB to read: not what CPython keeps")
        try:
            data = os.pread(self._fd, size, address) if 0 < address < 1 << 63 else b""
        except OSError:
            data = b""
        if len(data) != size:
            raise Unreadable(f"cannot read {size} bytes at {address:#x}")
        return data

    def word(self, address: int) -> int:
        return _Q.unpack(self.read(address, 8))[0]

    def words(self, address: int, count: int) -> tuple[int, ...]:
        return struct.unpack(f"<{count}Q", self.read(address, 8 * count))


def build_of(path: str) -> Optional[tuple[tuple[int, int], bool]]:
    """((3, minor), free-threaded) from the interpreter's file name (python3.X, libpython3.Xt.so);
    None if the name does not say."""
    match = _PYTHON_VERSION.search(os.path.basename(path))
    return ((3, int(match.group(1))), bool(match.group(2))) if match else None


def parking_build(path: str) -> tuple[tuple[int, int], bool]:
    """The interpreter's build (``build_of``) where ``pystructs.PARKING`` has its row, the offsets
    that tell its parks apart; else :class:`Unreadable` saying so."""
    build = build_of(path)
    if build is None or not build[1] or build[0] not in pystructs.PARKING:
        raise Unreadable(f"no parking offsets for {path} (otel_gil/pystructs.py)")
    return build


def load_base(maps: Sequence, mapped_path: str, info: elf.ElfInfo) -> int:
    """Where the interpreter's file is loaded (the address of its virtual address 0), from the
    process's mappings (``probes.mapped_files``)."""
    for m in maps:
        if m.path == mapped_path and m.offset == 0:
            return m.start - (min(v for v, _, _, _ in info.loads) & ~0xFFF)
    raise Unreadable(f"{mapped_path} is not mapped from its start")


def py_layout(pid: int, maps: Sequence, mapped_path: str, info: elf.ElfInfo) -> tuple[ringlib.PyLayout, str]:
    """The ``header.py`` of ``pid``'s ring (where its CPython keeps what a location reads), and
    why its holds will carry no location ("" if they will; ``minor`` is 0 then)."""
    build = build_of(mapped_path)
    structs = pystructs.for_version(*build) if build else None
    if structs is None:
        return ringlib.PyLayout(), f"no struct offsets for {os.path.basename(mapped_path)} (otel_gil/pystructs.py)"
    missing = [name for name in (*_TYPES, "_PyRuntime") if name not in info.data]
    if missing:
        return ringlib.PyLayout(), f"{mapped_path} exports no {', '.join(missing)}"
    try:
        base = load_base(maps, mapped_path, info)
        if structs.debug:
            mem = Memory(pid)
            try:
                runtime = base + info.data["_PyRuntime"].address
                disagreement = pystructs.debug_offsets_disagree(structs, lambda at, size: mem.read(runtime + at, size))
            finally:
                mem.close()
            if disagreement:
                return ringlib.PyLayout(), disagreement
    except Unreadable as exc:
        return ringlib.PyLayout(), str(exc)
    types = (base + info.data[name].address for name in _TYPES)
    return pystructs.py_layout(build[0], *types, free_threaded=build[1]), ""


def gil_enabled(pid: int, maps: Sequence, mapped_path: str, info: elf.ElfInfo) -> bool:
    """Whether a free-threaded ``pid`` runs with its GIL on now (``PYTHON_GIL=1``, or turned on
    by an import): its main interpreter's ``_gil_runtime_state.enabled``; Unreadable if unknown."""
    build = build_of(mapped_path)
    if build is None or "_PyRuntime" not in info.data:
        raise Unreadable(f"{mapped_path} does not say which CPython it is, or exports no _PyRuntime")
    mem = Memory(pid)
    try:
        runtime = load_base(maps, mapped_path, info) + info.data["_PyRuntime"].address
        address = pystructs.gil_enabled_address(build[0], runtime, mem.read)
        if address is None:
            raise Unreadable(f"where {os.path.basename(mapped_path)} keeps whether its GIL is on is unknown")
        return struct.unpack("<i", mem.read(address, 4))[0] != 0
    finally:
        mem.close()

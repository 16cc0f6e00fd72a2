"""Thread names as ``threading`` gives them, read from a CPython process's memory.

CPython before 3.14 leaves every OS thread named after the executable (and /proc
cuts names at 15 characters), so ``report``, ``top`` and ``--timeline`` read the
names where ``threading`` keeps them: ``_PyRuntime`` (an exported symbol) → the
main interpreter → ``sys.modules`` → the ``threading`` module's dict →
``_active`` ({ident: Thread}) → each Thread's ``_name`` and ``_native_id`` (the
thread's id in the process's own pid namespace, as the slots have it).

Read-only, through ``/proc/<pid>/mem`` (root, as for the probes; :mod:`pyprocess`):
any inconsistency ends in :class:`Unreadable`, whose message says why (the caller
falls back to /proc's names).

The struct offsets are otel_gil's table (``otel_gil.pystructs``: one row per version,
checked against each interpreter's own headers, and on 3.13+ against the running
build's own ``_Py_DebugOffsets``); the few layout changes by version are in the
readers below (dict keys 3.11, ``PyLongObject`` 3.12, instance dicts 3.11, 3.12, 3.13).
"""

from __future__ import annotations

import os
import struct

from otel_gil import pystructs
from otel_gil_collector import elf, probes
from otel_gil_collector.pyprocess import Memory, Unreadable, build_of, load_base


# Stable since 3.0: PyTypeObject, PyModuleObject, PyDictObject, PyLongObject fields, from the
# end of the object's header (PyObject: 16 bytes, 32 on a free-threaded build, which the
# layout's ob_type says, as the ring's does): ob_size, then the type's own fields.
_TP_BASICSIZE, _TP_FLAGS, _TP_DICTOFFSET = 16, 152, 272
_MD_DICT = 0
_MA_KEYS = 16
_LONG_DIGITS = 8
_MANAGED_DICT, _INLINE_VALUES = 1 << 4, 1 << 2  # tp_flags, 3.11+ / 3.13+
_UNICODE_STATE = 32
_MAX_ENTRIES = 1 << 16  # dicts larger than this are not sys.modules or threading's
_MAX_NAME = 1024  # characters
class _Reader:
    """Python objects of one process, for one version's layout."""

    def __init__(self, mem: Memory, version: tuple[int, int], layout: pystructs.Structs, types: dict[str, int]) -> None:
        self.mem, self.version, self.layout, self.types = mem, version, layout, types
        self.head = layout.ob_type + 8  # where PyObject ends: ob_size, or the object's own fields

    def type_of(self, obj: int) -> int:
        return self.mem.word(obj + self.layout.ob_type)

    def expect(self, obj: int, type_name: str) -> None:
        if self.type_of(obj) != self.types[type_name]:
            raise Unreadable(f"object at {obj:#x} is not a {type_name[:-5]}")

    def str(self, obj: int) -> str:
        self.expect(obj, "PyUnicode_Type")
        (length,), (state,) = struct.unpack("<q", self.mem.read(obj + self.layout.str_length, 8)), \
            struct.unpack("<I", self.mem.read(obj + self.layout.str_state, 4))
        kind, compact, ascii_ = (state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1
        if not compact or kind not in (1, 2, 4) or not 0 <= length <= _MAX_NAME:
            raise Unreadable(f"str at {obj:#x} is not a compact string")
        data = obj + (self.layout.str_ascii_data if ascii_ else self.layout.str_compact_data)
        raw = self.mem.read(data, length * kind)
        return raw.decode({1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind])

    def int(self, obj: int) -> int:
        self.expect(obj, "PyLong_Type")
        size = self.mem.word(obj + self.head)
        if self.version >= (3, 12):  # lv_tag: digit count << 3 | sign (0 +, 1 zero, 2 -)
            count, sign = size >> 3, 1 - (size & 3)
        else:
            size = size - (1 << 64) if size >= 1 << 63 else size
            count, sign = abs(size), (size > 0) - (size < 0)
        if count > 4:
            raise Unreadable(f"int at {obj:#x} is too large for a thread id")
        digits = struct.unpack(f"<{count}I", self.mem.read(obj + self.head + _LONG_DIGITS, 4 * count)) if count else ()
        return sign * sum(d << (30 * i) for i, d in enumerate(digits))

    def _keys(self, keys: int) -> list[tuple[int, int]]:
        """[(key, value)...] of a PyDictKeysObject's entries (values are 0 in split tables)."""
        if self.version >= (3, 11):
            _, log2_index_bytes, kind = self.mem.read(keys + 8, 3)  # dk_log2_size, ..., dk_kind
            nentries = self.mem.word(keys + 24)
            entries = keys + 32 + (1 << log2_index_bytes)
            general = kind == 0  # else unicode or split: entries without the hash
        else:
            size, _, _, nentries = self.mem.words(keys + 8, 4)
            width = 1 if size <= 0xFF else 2 if size <= 0xFFFF else 4 if size <= 0xFFFFFFFF else 8
            entries = keys + 40 + size * width
            general = True
        if not 0 <= nentries <= _MAX_ENTRIES:
            raise Unreadable(f"dict keys at {keys:#x} claim {nentries} entries")
        if not nentries:
            return []
        step = 3 if general else 2
        raw = self.mem.words(entries, step * nentries)
        return [(raw[i + step - 2], raw[i + step - 1]) for i in range(0, len(raw), step)]

    def _values(self, values: int, count: int) -> tuple[int, ...]:
        """The values array of a split table (PyDictValues: 8 bytes of header from 3.13)."""
        return self.mem.words(values + (8 if self.version >= (3, 13) else 0), count) if count else ()

    def _entries(self, keys: int, values: int) -> list[tuple[int, int]]:
        """(key, value) of every live entry, the values from ``values`` in a split table."""
        entries = self._keys(keys)
        if values:
            entries = [(k, v) for (k, _), v in zip(entries, self._values(values, len(entries)))]
        return [(k, v) for k, v in entries if k and v]

    def _by_name(self, entries: list[tuple[int, int]]) -> dict[str, int]:
        return {self.str(k): v for k, v in entries if self.type_of(k) == self.types["PyUnicode_Type"]}

    def _dict_entries(self, obj: int) -> list[tuple[int, int]]:
        self.expect(obj, "PyDict_Type")
        return self._entries(*self.mem.words(obj + self.head + _MA_KEYS, 2))

    def dict_items(self, obj: int) -> dict[str, int]:
        """{str key: value address} of a dict (other keys skipped)."""
        return self._by_name(self._dict_entries(obj))

    def dict_values(self, obj: int) -> list[int]:
        return [v for _, v in self._dict_entries(obj)]

    def attributes(self, obj: int) -> dict[str, int]:
        """An instance's attributes: its __dict__, or its inline/split values (3.11+)."""
        tp = self.type_of(obj)
        flags, dictoffset = self.mem.word(tp + self.head + _TP_FLAGS), self.mem.word(tp + self.head + _TP_DICTOFFSET)
        if self.version < (3, 11) or not flags & _MANAGED_DICT:
            if not 0 < dictoffset < 1 << 16:
                raise Unreadable(f"object at {obj:#x} has no __dict__")
            return self.dict_items(self.mem.word(obj + dictoffset))
        cached_keys = self.mem.word(tp + self.layout.cached_keys)
        if self.version >= (3, 13):
            managed = self.mem.word(obj + self.layout.managed_dict)
            if managed:
                return self.dict_items(managed)
            if flags & _INLINE_VALUES:
                values = obj + self.mem.word(tp + self.head + _TP_BASICSIZE)
                if self.mem.read(values + 3, 1) != b"\x01":  # PyDictValues.valid
                    raise Unreadable(f"object at {obj:#x} has invalidated inline values")
                return self._by_name(self._entries(cached_keys, values))
            raise Unreadable(f"object at {obj:#x} has no __dict__ yet")
        if self.version >= (3, 12):
            tagged = self.mem.word(obj + self.layout.managed_dict)  # _PyDictOrValues: the values' address - 1, or a dict
            return self._by_name(self._entries(cached_keys, tagged + 1)) if tagged & 1 else self.dict_items(tagged)
        values, managed = self.mem.words(obj + self.layout.managed_dict - 8, 2)
        return self._by_name(self._entries(cached_keys, values)) if values else self.dict_items(managed)


def read(pid: int, mapped_path: str, host_path: str) -> dict[int, str]:
    """{tid in the process's pid namespace: threading name} of every thread ``threading`` knows.

    ``mapped_path``: the interpreter's file as /proc/<pid>/maps names it; ``host_path``:
    the same file as the collector opens it.
    """
    try:
        info = elf.load(host_path)
    except elf.ElfLookupError as exc:
        raise Unreadable(str(exc)) from None
    build = build_of(mapped_path)
    layout = pystructs.for_version(*build) if build else None
    if layout is None:
        raise Unreadable(f"no struct layout for {os.path.basename(mapped_path)} (versions: "
                         f"{', '.join(f'{a}.{b}' for a, b in pystructs.STRUCTS)}, free-threaded "
                         f"{', '.join(f'{a}.{b}t' for a, b in pystructs.FREE_THREADED)})")
    version = build[0]
    needed = ("_PyRuntime", "PyDict_Type", "PyUnicode_Type", "PyLong_Type", "PyModule_Type")
    missing = [name for name in needed if name not in info.data]
    if missing:
        raise Unreadable(f"{mapped_path} exports no {', '.join(missing)}")
    try:
        base = load_base(probes.mapped_files(pid), mapped_path, info)
    except probes.UnsupportedProcess as exc:
        raise Unreadable(str(exc)) from None
    mem = Memory(pid)
    try:
        reader = _Reader(mem, version, layout, {name: base + info.data[name].address for name in needed[1:]})
        runtime = base + info.data["_PyRuntime"].address
        disagreement = pystructs.debug_offsets_disagree(layout, lambda at, size: mem.read(runtime + at, size))
        if disagreement:
            raise Unreadable(disagreement)
        interp = mem.word(runtime + layout.interpreters_main)
        modules = reader.dict_items(mem.word(interp + layout.modules))
        threading = modules.get("threading")
        if threading is None:
            return {}  # never imported threading: one thread, no name of its own
        reader.expect(threading, "PyModule_Type")
        active = reader.dict_items(mem.word(threading + reader.head + _MD_DICT)).get("_active")
        if active is None:
            raise Unreadable("threading has no _active dict")
        names = {}
        for thread in reader.dict_values(active):
            attrs = reader.attributes(thread)
            if "_name" in attrs and attrs.get("_native_id"):
                native_id = attrs["_native_id"]
                if reader.type_of(native_id) == reader.types["PyLong_Type"]:
                    names[reader.int(native_id)] = reader.str(attrs["_name"])
        return names
    finally:
        mem.close()

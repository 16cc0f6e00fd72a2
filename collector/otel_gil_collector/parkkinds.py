"""What the addresses a free-threaded process parked on belong to, read from its memory (root,
read-only: :mod:`pyprocess`): the in-process writer's ``park_kind()`` (otel_gil/_inprocess.c)
from outside, on the same ``pystructs.PARKING`` row and in the same order (ring.PARK_*): a
thread state's ``state`` or a stop-the-world's event, then ``_PyRuntime``'s or the main
interpreter's other fields, a ``threading.Lock``'s mutex, an object's ``ob_mutex`` (with its
type's name), else other. An address is read at each poll that finds new parks on it or a park
still open there (``otel-gil report`` polls every 10 ms), never kept: by the next, its memory may
hold another object, or another thread's state.
"""

from __future__ import annotations

from typing import Sequence

from otel_gil import pystructs
from otel_gil import ring as ringlib
from otel_gil_collector import elf
from otel_gil_collector.pyprocess import Memory, Unreadable, load_base, parking_build

MAX_THREADS = 4096  # thread states walked at most (a hostile list's loop ends there); report has 2048 slots
Kind = tuple[int, str]  # (ring.PARK_*, the object's type name for PARK_OBJECT, else "")


class Classifier:
    """Kinds of one process's park addresses; :class:`Unreadable` if its memory cannot say."""

    def __init__(self, pid: int, maps: Sequence, mapped_path: str, info: elf.ElfInfo) -> None:
        build = parking_build(mapped_path)
        missing = [name for name in ("_PyRuntime", "PyType_Type") if name not in info.data]
        if missing:
            raise Unreadable(f"{mapped_path} exports no {', '.join(missing)}")
        self.pid, self.row, structs = pid, pystructs.PARKING[build[0]], pystructs.for_version(*build)
        base = load_base(maps, mapped_path, info)
        self.runtime, self.type_type = (base + info.data[name].address for name in ("_PyRuntime", "PyType_Type"))
        mem = Memory(pid)
        try:
            disagreement = pystructs.debug_offsets_disagree(structs, lambda at, n: mem.read(self.runtime + at, n))
            if disagreement:
                raise Unreadable(disagreement)
            self.runtime_size, self.interp_size, self.threads_head, self.tstate_next = (
                mem.word(self.runtime + at) for at in (pystructs.DEBUG_RUNTIME_SIZE, pystructs.DEBUG_INTERP_SIZE,
                                                       pystructs.DEBUG_THREADS_HEAD, self.row.debug_tstate_next))
            self.interp = mem.word(self.runtime + structs.interpreters_main)
        finally:
            mem.close()

    def kinds_of(self, addresses: set[int]) -> dict[int, Kind]:
        """Each address's kind, read now (all other if the process is gone)."""
        try:
            mem = Memory(self.pid)
        except Unreadable:
            return dict.fromkeys(addresses, (ringlib.PARK_OTHER, ""))
        try:
            states = self._thread_states(mem)
            return {addr: self._kind(mem, addr, states) for addr in addresses}
        finally:
            mem.close()

    def _thread_states(self, mem: Memory) -> set[int]:
        """The ``state`` fields of the main interpreter's thread states (as many as were readable)."""
        states: set[int] = set()
        try:
            tstate = mem.word(self.interp + self.threads_head)
            while tstate and len(states) < MAX_THREADS and tstate + self.row.tstate_state not in states:
                states.add(tstate + self.row.tstate_state)
                tstate = mem.word(tstate + self.tstate_next)
        except Unreadable:
            pass
        return states

    def _kind(self, mem: Memory, addr: int, states: set[int]) -> Kind:
        row = self.row
        if addr in states or addr in (self.runtime + row.stw_runtime, self.interp + row.stw_interp):
            return ringlib.PARK_STW, ""
        if 0 <= addr - self.runtime < self.runtime_size or 0 <= addr - self.interp < self.interp_size:
            return ringlib.PARK_INTERNAL, ""
        lock = addr - row.lock_mutex
        if lock % 8 == 0 and self._type_name(mem, lock) in pystructs.LOCK_TYPE_NAMES:
            return ringlib.PARK_APP_LOCK, ""
        if (addr - row.ob_mutex) % 8 == 0:
            name = self._type_name(mem, addr - row.ob_mutex)
            if name is not None:
                return ringlib.PARK_OBJECT, name.decode("utf-8", "replace")
        return ringlib.PARK_OTHER, ""

    def _type_name(self, mem: Memory, op: int) -> bytes | None:
        """The name of the type of the object at ``op`` (b"" if unreadable), None if ``op`` is no
        object: its type's type is neither ``type`` nor a metaclass of it."""
        try:
            tp = mem.word(op + self.row.ob_type)
            meta = mem.word(tp + self.row.ob_type)
            if meta != self.type_type and mem.word(meta + self.row.ob_type) != self.type_type:
                return None
        except Unreadable:
            return None
        try:
            return mem.read(mem.word(tp + self.row.tp_name), ringlib.PARK_TYPE - 1).split(b"\0", 1)[0]
        except Unreadable:  # an object all the same, its name unread (as park_kind's object_type)
            return b""

"""parkkinds.Classifier on a fake process memory: each kind of address as the in-process
writer's park_kind() tells it (the real ones: tests/integration/test_report_parks.py)."""

from __future__ import annotations

import struct

from otel_gil import pystructs
from otel_gil import ring
from otel_gil_collector import parkkinds
from otel_gil_collector.parkkinds import Classifier
from otel_gil_collector.pyprocess import Unreadable

ROW = pystructs.PARKING[(3, 13)]
RUNTIME, INTERP, TYPE_TYPE, META = 0x10000, 0x20000, 0x30000, 0x31000
LIST_TYPE, LOCK_TYPE, NAMES = 0x40000, 0x41000, 0x50000
LIST, LOCK, TSTATE = 0x60000, 0x61000, 0x62000


class FakeMemory:
    def __init__(self) -> None:
        self.bytes: dict[int, int] = {}

    def put(self, address: int, data: bytes) -> None:
        self.bytes.update((address + i, b) for i, b in enumerate(data))

    def word(self, address: int) -> int:
        return struct.unpack("<Q", self.read(address, 8))[0]

    def read(self, address: int, size: int) -> bytes:
        if any(address + i not in self.bytes for i in range(size)):
            raise Unreadable(f"cannot read {size} bytes at {address:#x}")
        return bytes(self.bytes[address + i] for i in range(size))

    def close(self) -> None:
        pass


def process() -> tuple[Classifier, FakeMemory]:
    kinds, mem = Classifier.__new__(Classifier), FakeMemory()
    kinds.row, kinds.runtime, kinds.interp, kinds.type_type = ROW, RUNTIME, INTERP, TYPE_TYPE
    kinds.runtime_size, kinds.interp_size = 0x1000, 0x1000
    word = lambda at, value: mem.put(at, struct.pack("<Q", value))  # noqa: E731
    word(META + ROW.ob_type, TYPE_TYPE)  # a metaclass: its type is type
    for tp, meta, name in ((LIST_TYPE, TYPE_TYPE, b"list"), (LOCK_TYPE, META, b"_thread.lock")):
        word(tp + ROW.ob_type, meta)
        word(tp + ROW.tp_name, NAMES + tp)
        mem.put(NAMES + tp, name.ljust(ring.PARK_TYPE, b"\0"))
    word(LIST + ROW.ob_type, LIST_TYPE)
    word(LOCK + ROW.ob_type, LOCK_TYPE)
    return kinds, mem


def test_each_kind():
    kinds, mem = process()
    states = {TSTATE + ROW.tstate_state}
    assert kinds._kind(mem, TSTATE + ROW.tstate_state, states) == (ring.PARK_STW, "")
    assert kinds._kind(mem, RUNTIME + ROW.stw_runtime, states) == (ring.PARK_STW, "")
    assert kinds._kind(mem, INTERP + ROW.stw_interp, states) == (ring.PARK_STW, "")
    assert kinds._kind(mem, RUNTIME + 0x100, states) == (ring.PARK_INTERNAL, "")
    assert kinds._kind(mem, INTERP + 0xFFF, states) == (ring.PARK_INTERNAL, "")
    assert kinds._kind(mem, LOCK + ROW.lock_mutex, states) == (ring.PARK_APP_LOCK, "")
    assert kinds._kind(mem, LIST + ROW.ob_mutex, states) == (ring.PARK_OBJECT, "list")
    # A lock's own ob_mutex is a critical section on it, not the lock: a type named like one.
    assert kinds._kind(mem, LOCK + ROW.ob_mutex, states) == (ring.PARK_OBJECT, "_thread.lock")


def test_what_is_no_object_is_other():
    kinds, mem = process()
    assert kinds._kind(mem, 0x70000 + ROW.ob_mutex, set()) == (ring.PARK_OTHER, "")  # unreadable
    mem.put(0x70000 + ROW.ob_type, struct.pack("<Q", 0x71000))  # its "type"'s type is 0: not a type
    mem.put(0x71000, bytes(64))
    assert kinds._kind(mem, 0x70000 + ROW.ob_mutex, set()) == (ring.PARK_OTHER, "")
    assert kinds._kind(mem, LIST + ROW.ob_mutex + 1, set()) == (ring.PARK_OTHER, "")  # misaligned


def test_a_process_gone_leaves_every_address_other():
    kinds, _ = process()
    kinds.pid = 1 << 30  # no such pid: /proc/<pid>/mem fails
    assert kinds.kinds_of({LIST, LOCK}) == {LIST: (ring.PARK_OTHER, ""), LOCK: (ring.PARK_OTHER, "")}


def test_an_address_is_read_again_at_each_call(monkeypatch):
    """A list freed and a dict allocated at its address: a later park there is on a dict."""
    kinds, mem = process()
    kinds.pid, kinds.threads_head, kinds.tstate_next = 1, 0x800, 0x8  # no thread states readable
    monkeypatch.setattr(parkkinds, "Memory", lambda pid: mem)
    assert kinds.kinds_of({LIST + ROW.ob_mutex}) == {LIST + ROW.ob_mutex: (ring.PARK_OBJECT, "list")}
    dict_type = 0x42000
    mem.put(dict_type + ROW.ob_type, struct.pack("<Q", TYPE_TYPE))
    mem.put(dict_type + ROW.tp_name, struct.pack("<Q", NAMES + dict_type))
    mem.put(NAMES + dict_type, b"dict".ljust(ring.PARK_TYPE, b"\0"))
    mem.put(LIST + ROW.ob_type, struct.pack("<Q", dict_type))
    assert kinds.kinds_of({LIST + ROW.ob_mutex}) == {LIST + ROW.ob_mutex: (ring.PARK_OBJECT, "dict")}

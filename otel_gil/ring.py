"""The Python half of the shared-memory layout (the C half is collector/gil_layout.h).

The collector hands each registered process a read-only file descriptor for a
BPF array: entry 0 is a :class:`Header`, entries ``1..nslots`` are one
:class:`Slot` per thread. :class:`Ring` maps it and reads it with plain loads.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from dataclasses import dataclass
from typing import Iterator, NamedTuple

MAGIC = 0x004C49474C45544F
LAYOUT_VERSION = 3
HIST_BUCKETS = 32
RING_LEN = 16
PROBE_LEN = 16
SLOT_IN_TAKE_GIL = 1
CLOCK_MONOTONIC = 1

_u32 = ctypes.c_uint32
_u64 = ctypes.c_uint64


class LongWait(ctypes.Structure):
    _fields_ = [
        ("start_ns", _u64),
        ("end_ns", _u64),
        ("blocker_tid", _u32),
        ("reserved", _u32),
    ]


class LongHold(ctypes.Structure):
    _fields_ = [
        ("start_ns", _u64),
        ("end_ns", _u64),
    ]


class Slot(ctypes.Structure):
    _fields_ = [
        ("seq", _u64),
        ("tid", _u32),
        ("flags", _u32),
        ("wait_ns", _u64),
        ("hold_ns", _u64),
        ("acquisitions", _u64),
        ("convoy_waits", _u64),
        ("long_waits", _u64),
        ("wait_start_ns", _u64),
        ("acquired_ns", _u64),
        ("hist", _u32 * HIST_BUCKETS),
        ("ring", LongWait * RING_LEN),
        ("long_holds", _u64),
        ("hold_ring", LongHold * RING_LEN),
    ]


class Header(ctypes.Structure):
    _fields_ = [
        ("magic", _u64),
        ("layout_version", _u32),
        ("slot_size", _u32),
        ("nslots", _u32),
        ("clock_id", _u32),
        ("pid", _u32),
        ("cond_stride", _u32),
        ("long_wait_ns", _u64),
        ("convoy_ns", _u64),
        ("pidns_dev", _u64),
        ("pidns_ino", _u64),
        ("gil_cond", _u64),
        ("switch_cond", _u64),
        ("last_release_tid", _u32),
        ("reserved", _u32),
        ("slot_overflows", _u64),
        ("exited_threads", _u64),
        ("exited_wait_ns", _u64),
        ("exited_hold_ns", _u64),
        ("exited_acquisitions", _u64),
        ("exited_convoy_waits", _u64),
        ("long_hold_ns", _u64),
    ]


SLOT_SIZE = ctypes.sizeof(Slot)


class LayoutError(Exception):
    """The mapped region is not an otel-gil ring this reader understands."""


class Counters(NamedTuple):
    """One thread's cumulative figures at a point in time (open intervals included)."""

    wait_ns: int
    hold_ns: int
    acquisitions: int
    convoy_waits: int
    long_waits: int


ZERO = Counters(0, 0, 0, 0, 0)


@dataclass(frozen=True)
class Wait:
    """A long wait: when it started and ended, and who released the GIL to us."""

    start_ns: int
    end_ns: int
    blocker_tid: int


def counters(slot: Slot, now_ns: int) -> Counters:
    """Figures of ``slot``, with any open wait or hold counted up to ``now_ns``."""
    wait = slot.wait_ns
    if slot.wait_start_ns and now_ns > slot.wait_start_ns:
        wait += now_ns - slot.wait_start_ns
    hold = slot.hold_ns
    if slot.acquired_ns and now_ns > slot.acquired_ns:
        hold += now_ns - slot.acquired_ns
    return Counters(wait, hold, slot.acquisitions, slot.convoy_waits, slot.long_waits)


def long_waits_since(slot: Slot, since: int) -> tuple[list[Wait], int]:
    """Long waits recorded after the ``since``-th one, oldest first, and how many were overwritten."""
    total = slot.long_waits
    first = max(since, total - RING_LEN)
    waits = []
    for i in range(first, total):
        lw = slot.ring[i % RING_LEN]
        waits.append(Wait(lw.start_ns, lw.end_ns, lw.blocker_tid))
    return waits, first - since


def long_holds_since(slot: Slot, since: int) -> tuple[list[tuple[int, int]], int]:
    """Long holds ``(start_ns, end_ns)`` recorded after the ``since``-th one, oldest first, and how many were overwritten."""
    total = slot.long_holds
    first = max(since, total - RING_LEN)
    return [(slot.hold_ring[i % RING_LEN].start_ns, slot.hold_ring[i % RING_LEN].end_ns) for i in range(first, total)], first - since


def hist_quantile(hist, q: float) -> int:
    """Upper bound in ns of the histogram bucket holding quantile ``q`` of the waits; 0 if none."""
    total = sum(hist)
    seen = 0
    for bucket, count in enumerate(hist):
        seen += count
        if count and seen >= q * total:
            return 1 << (bucket + 1)
    return 0


def hist_bucket(wait_ns: int) -> int:
    """The histogram bucket of a wait, as the BPF side computes it (floor log2, clamped)."""
    return min(max(wait_ns, 1).bit_length() - 1, HIST_BUCKETS - 1)


def _libc_mmap():
    libc = ctypes.CDLL(None, use_errno=True)
    fn = libc.mmap
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    unmap = libc.munmap
    unmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return fn, unmap


class Ring:
    """A read-only view of one process's slots, mapped from the collector's fd."""

    def __init__(self, address: int, size: int, unmap=None) -> None:
        self._address = address
        self._size = size
        self._unmap = unmap
        self.header = Header.from_address(address)
        h = self.header
        if h.magic != MAGIC:
            raise LayoutError(f"bad magic {h.magic:#x}: not an otel-gil ring")
        if h.layout_version != LAYOUT_VERSION or h.slot_size != SLOT_SIZE:
            raise LayoutError(
                f"ring layout v{h.layout_version} ({h.slot_size} B slots), this otel_gil reads "
                f"v{LAYOUT_VERSION} ({SLOT_SIZE} B): upgrade otel_gil or the collector so they match"
            )
        if size < (h.nslots + 1) * SLOT_SIZE:
            raise LayoutError(f"mapping of {size} B is too small for {h.nslots} slots")
        self.nslots = h.nslots
        self._slots = [Slot.from_address(address + i * SLOT_SIZE) for i in range(1, h.nslots + 1)]

    @classmethod
    def map_fd(cls, fd: int, size: int) -> "Ring":
        """Map ``size`` bytes of a BPF array fd read-only (no privilege needed)."""
        mmap_fn, munmap_fn = _libc_mmap()
        addr = mmap_fn(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            err = ctypes.get_errno()
            raise OSError(err, f"mmap of the GIL ring failed: {os.strerror(err)}")
        try:
            return cls(addr, size, lambda: munmap_fn(addr, size))
        except Exception:
            munmap_fn(addr, size)
            raise

    @classmethod
    def from_bytes(cls, data: bytearray) -> "Ring":
        """A ring over a writable buffer (tests build synthetic rings this way)."""
        buf = (ctypes.c_char * len(data)).from_buffer(data)
        ring = cls(ctypes.addressof(buf), len(data))
        ring._keepalive = buf
        return ring

    def __del__(self) -> None:
        # Unmapped only when nothing references the ring any more: a span hook on
        # another thread may still be reading a ring the registrar has replaced.
        if self._unmap is not None:
            self._unmap()
            self._unmap = None

    def find(self, tid: int, hint: int = -1) -> int:
        """Index of ``tid``'s slot (``hint`` first), -1 if the thread has none yet."""
        slots = self._slots
        if 0 <= hint < len(slots) and slots[hint].tid == tid:
            return hint
        n = len(slots)
        for i in range(PROBE_LEN):
            idx = (tid + i) % n
            if slots[idx].tid == tid:
                return idx
        return -1

    def slot(self, index: int) -> Slot:
        return self._slots[index]

    def snapshot(self, index: int) -> Slot:
        """A consistent copy of another thread's slot (seqlock: retried while being written)."""
        live = self._slots[index]
        while True:
            seq = live.seq
            copy = Slot.from_buffer_copy(live)
            if not seq & 1 and live.seq == seq:
                return copy

    def threads(self) -> Iterator[Slot]:
        """Consistent copies of every occupied slot."""
        for i, live in enumerate(self._slots):
            if live.tid:
                copy = self.snapshot(i)
                if copy.tid:
                    yield copy

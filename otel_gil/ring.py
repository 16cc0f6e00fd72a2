"""The Python half of the shared-memory layout (the C half is gil_layout.h, beside it).

The collector hands each registered process a read-only file descriptor for a
BPF array (the in-process writer fills the same layout in the process's own
memory): entry 0 is a :class:`Header`, entries ``1..nslots`` are one
:class:`Slot` per thread, then ``HOLD_PAGES`` entries hold the process's hold log
(every thread's recent holds, for blame by time held), then ``LOC_LEN`` entries
the :class:`LocationRecord` of the newest logged holds (which code held the GIL).
:class:`Ring` maps it and reads it with plain loads. What each writer event
writes: gil_writer.h.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
import time
from bisect import bisect_right
from dataclasses import dataclass
from typing import Iterator, NamedTuple, Optional

MAGIC = 0x004C49474C45544F
LAYOUT_VERSION = 7
HIST_BUCKETS = 32
RING_LEN = 16
PROBE_LEN = 16
HOLD_LOG_LEN = 4096
HOLDS_PER_PAGE = 32
HOLD_PAGES = HOLD_LOG_LEN // HOLDS_PER_PAGE
SLOT_IN_TAKE_GIL = 1
SLOT_FORCED = 2
SLOT_UNCHECKED = 4
WAIT_FORCED = 1
HOLD_RECORD_NS = 100_000  # header.hold_record_ns, as both writers set it: holds this long are logged
LOC_LEN = 1024
LOC_FRAMES = 4
LOC_NAME = 64
LOC_FILE = 144
# Why a location lacks frames or lines (bit i of LocationRecord.why; header.location_misses[i]).
LOC_NO_LAYOUT, LOC_HOLDER, LOC_NO_FRAME, LOC_UNREADABLE, LOC_NOT_CODE, LOC_NOT_STR, LOC_NO_LINE = range(7)
LOC_WHYS = 8
LOC_WHY_NAMES = ("no_layout", "holder", "no_frame", "unreadable", "not_code", "not_str", "no_line")
FRAME_OBJECT, FRAME_INTERP = 1, 2
LINES_LNOTAB, LINES_PAIRS, LINES_LOCATIONS = 1, 2, 3
# Parks (free-threaded builds, GIL off), by what they parked on: Slot.parked_ns[i], LongPark.kind.
PARK_STW, PARK_OBJECT, PARK_APP_LOCK, PARK_INTERNAL, PARK_OTHER = range(5)
PARK_KINDS = 5
PARK_RING_LEN = 8
PARK_TYPE = 24
CLOCK_MONOTONIC = 1
SNAPSHOT_TRIES = 10_000

_u32 = ctypes.c_uint32
_u64 = ctypes.c_uint64


class LongWait(ctypes.Structure):
    _fields_ = [
        ("start_ns", _u64),
        ("end_ns", _u64),
        ("blocker_tid", _u32),
        ("flags", _u32),
        ("held_ns", _u64),
    ]


class HoldRecord(ctypes.Structure):
    _fields_ = [
        ("start_ns", _u64),
        ("end_ns", _u64),
        ("tid", _u32),
        ("reserved", _u32),
    ]


class HoldPage(ctypes.Structure):
    _fields_ = [("holds", HoldRecord * HOLDS_PER_PAGE)]


class FrameRecord(ctypes.Structure):
    _fields_ = [
        ("line", _u32),
        ("name_kind", ctypes.c_uint8),
        ("file_kind", ctypes.c_uint8),
        ("reserved", ctypes.c_uint16),
        ("name_len", _u32),
        ("file_len", _u32),
        ("name", ctypes.c_uint8 * LOC_NAME),
        ("file", ctypes.c_uint8 * LOC_FILE),
    ]


class LocationRecord(ctypes.Structure):
    _fields_ = [
        ("seq", _u64),
        ("nframes", _u32),
        ("why", _u32),
        ("frames", FrameRecord * LOC_FRAMES),
    ]


class PyLayout(ctypes.Structure):
    """Where the process's CPython keeps what a location is read from (gil_layout.h: struct gil_py_layout)."""

    _fields_ = [
        ("minor", ctypes.c_uint16),
        ("frame_kind", ctypes.c_uint8),
        ("line_format", ctypes.c_uint8),
        ("lasti_scale", ctypes.c_uint8),
        ("code_tag_bits", ctypes.c_uint8),
        ("skip_owner", ctypes.c_uint8),
        ("reserved", ctypes.c_uint8),
        *((name, ctypes.c_int32) for name in (
            "gil_last_holder", "tstate_frame", "cframe_frame", "frame_previous", "frame_code", "frame_instr", "frame_owner", "code_name", "code_filename",
            "code_firstlineno", "code_linetable", "code_code", "code_firsttraceable", "bytes_size", "bytes_data",
            "str_length", "str_state", "str_ascii_data", "str_compact_data", "ob_type")),
        ("code_type", _u64),
        ("str_type", _u64),
        ("bytes_type", _u64),
    ]


class LongHold(ctypes.Structure):
    _fields_ = [
        ("start_ns", _u64),
        ("end_ns", _u64),
    ]


class LongPark(ctypes.Structure):
    _fields_ = [
        ("start_ns", _u64),
        ("end_ns", _u64),
        ("addr", _u64),
        ("kind", _u32),
        ("reserved", _u32),
        ("type", ctypes.c_char * PARK_TYPE),
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
        ("wait_mark_ns", _u64),
        ("wait_acq_mark", _u64),
        ("forced_waits", _u64),
        ("forced_acq_mark", _u64),
        ("tstate", _u64),
        ("parked_ns", _u64 * PARK_KINDS),
        ("parks", _u64),
        ("park_start_ns", _u64),
        ("park_addr", _u64),
        ("park_kind", _u32),
        ("park_reserved", _u32),
        ("park_type", ctypes.c_char * PARK_TYPE),
        ("long_parks", _u64),
        ("park_ring", LongPark * PARK_RING_LEN),
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
        ("holder_tid", _u32),
        ("slot_overflows", _u64),
        ("exited_threads", _u64),
        ("exited_wait_ns", _u64),
        ("exited_hold_ns", _u64),
        ("exited_acquisitions", _u64),
        ("exited_convoy_waits", _u64),
        ("long_hold_ns", _u64),
        ("last_acquired_ns", _u64),
        ("acquisitions_total", _u64),
        ("held_total_ns", _u64),
        ("drop_request", _u64),
        ("holds_written", _u64),
        ("hold_record_ns", _u64),
        ("exits_started", _u64),
        ("py", PyLayout),
        ("locations_written", _u64),
        ("location_misses", _u64 * LOC_WHYS),
        ("exited_parked_ns", _u64 * PARK_KINDS),
    ]


SLOT_SIZE = ctypes.sizeof(Slot)


def _leading_fields(structure, last: str) -> struct.Struct:
    """A struct.Struct reading ``structure``'s fields up to ``last`` in one call (span hooks are hot)."""
    codes = {ctypes.sizeof(_u32): "I", ctypes.sizeof(_u64): "Q"}
    fmt = "<"
    for name, ctype in structure._fields_:
        assert getattr(structure, name).offset == struct.calcsize(fmt), f"padding before {name}"
        fmt += codes[ctypes.sizeof(ctype)]
        if name == last:
            return struct.Struct(fmt)
    raise ValueError(last)


_SLOT_HEAD = _leading_fields(Slot, "acquired_ns")  # seq .. acquired_ns
_TID = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_TID_OFFSET = Slot.tid.offset
_HOLD = struct.Struct("<QQI4x")
_HOLDS_WRITTEN_OFFSET = Header.holds_written.offset


def entries(nslots: int) -> int:
    """Array entries of a process with ``nslots`` thread slots: header, slots, hold log, locations."""
    return 1 + nslots + HOLD_PAGES + LOC_LEN


class LayoutError(Exception):
    """The mapped region is not an otel-gil ring this reader understands."""


class BusySlot(Exception):
    """A slot could not be read consistently (see :meth:`Ring.snapshot`)."""


class EndPassed(Exception):
    """The figures were asked for at a time in the past, and the thread's GIL changed hands
    since: what it had at that time is no longer in its slot (see :meth:`Ring.read`)."""


class Counters(NamedTuple):
    """One thread's cumulative figures at a point in time (open intervals included)."""

    wait_ns: int
    hold_ns: int
    acquisitions: int
    convoy_waits: int
    long_waits: int


ZERO = Counters(0, 0, 0, 0, 0)
_new_tuple = tuple.__new__


@dataclass(frozen=True)
class Wait:
    """A long wait: when it started and ended, who released the GIL to us, how long
    any thread held the GIL meanwhile (the rest was hand-off), and whether it began
    at a forced switch."""

    start_ns: int
    end_ns: int
    blocker_tid: int
    held_ns: int = 0
    forced: bool = False


class Hold(NamedTuple):
    """A recorded hold of the process's hold log; ``index``: its number in the log (for :meth:`Ring.location`)."""

    start_ns: int
    end_ns: int
    tid: int
    index: int = -1


class Frame(NamedTuple):
    """One Python frame of a location: the function's qualified name (3.11+; its plain
    name before, where code objects carry no other), its file and the line being run
    (None: unknown). A name cut at ``LOC_NAME`` bytes ends in "…", a path cut at
    ``LOC_FILE`` bytes starts with "…"."""

    function: str
    file: str
    line: Optional[int]


class Location(NamedTuple):
    """Where a thread's Python code was when it released the GIL: its innermost frames,
    innermost first (none where they could not be read), and why any are missing
    (names of ``LOC_WHY_NAMES``)."""

    frames: tuple[Frame, ...]
    missing: tuple[str, ...]


def held_during(holds: list[Hold], ends: list[int], start_ns: int, end_ns: int) -> dict[int, int]:
    """ns each thread held the GIL within ``[start_ns, end_ns)``, from ``holds`` in log order
    (holds never overlap, so they are sorted by start and end alike; ``ends`` = their end_ns)."""
    held: dict[int, int] = {}
    for i in range(bisect_right(ends, start_ns), len(holds)):
        h = holds[i]
        if h.start_ns >= end_ns:
            break
        held[h.tid] = held.get(h.tid, 0) + min(h.end_ns, end_ns) - max(h.start_ns, start_ns)
    return held


def _closed(wait: int, hold: int, acquisitions: int, convoy: int, long_waits: int,
            wait_start: int, acquired: int, now_ns: int) -> Counters:
    """A slot's figures with its open wait (if counted) and hold closed at ``now_ns``: the one
    place the Python side closes them (the C side: read_counters in fastspan.h)."""
    if wait_start and now_ns > wait_start:
        wait += now_ns - wait_start
    if acquired and now_ns > acquired:
        hold += now_ns - acquired
    return _new_tuple(Counters, (wait, hold, acquisitions, convoy, long_waits))  # twice as fast as Counters(...)


def counters(slot: Slot, now_ns: int) -> Counters:
    """Figures of ``slot``, with any open wait or hold counted up to ``now_ns`` (not a wait
    still unchecked: it may turn out to be no wait)."""
    wait_start = 0 if slot.flags & SLOT_UNCHECKED else slot.wait_start_ns
    return _closed(slot.wait_ns, slot.hold_ns, slot.acquisitions, slot.convoy_waits, slot.long_waits,
                   wait_start, slot.acquired_ns, now_ns)


def long_waits_since(slot: Slot, since: int) -> tuple[list[Wait], int]:
    """Long waits recorded after the ``since``-th one, oldest first, and how many were overwritten."""
    total = slot.long_waits
    first = max(since, total - RING_LEN)
    waits = []
    for i in range(first, total):
        lw = slot.ring[i % RING_LEN]
        waits.append(Wait(lw.start_ns, lw.end_ns, lw.blocker_tid, lw.held_ns, bool(lw.flags & WAIT_FORCED)))
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


_CODECS = {1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}


def _text(field, kind: int, length: int, keep_end: bool) -> str:
    """A str from the bytes a writer kept of it at the start of ``field`` (the string's start,
    or its end where ``keep_end``), with "…" where it was cut."""
    codec = _CODECS.get(kind)
    if codec is None:
        return ""
    whole = length * kind
    text = bytes(field)[:min(whole, len(field))].decode(codec, "replace")
    if whole <= len(field):
        return text
    return "…" + text if keep_end else text + "…"


def _frame(f: FrameRecord) -> Frame:
    return Frame(_text(f.name, f.name_kind, f.name_len, False), _text(f.file, f.file_kind, f.file_len, True),
                 f.line or None)


def location_of(record: LocationRecord) -> Location:
    """The :class:`Location` a record holds."""
    frames = tuple(_frame(record.frames[i]) for i in range(min(record.nframes, LOC_FRAMES)))
    return Location(frames, tuple(name for i, name in enumerate(LOC_WHY_NAMES) if record.why & 1 << i))


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
        if size < entries(h.nslots) * SLOT_SIZE:
            raise LayoutError(f"mapping of {size} B is too small for {h.nslots} slots and the hold log")
        self.nslots = h.nslots
        self.long_wait_ns = h.long_wait_ns  # fixed for the ring's life
        self._slots = [Slot.from_address(address + i * SLOT_SIZE) for i in range(1, h.nslots + 1)]
        self._bytes = memoryview((ctypes.c_char * size).from_address(address)).cast("B")
        self._locations = (1 + h.nslots + HOLD_PAGES) * SLOT_SIZE

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

    def continues(self, other: Optional["Ring"]) -> bool:
        """``other`` itself, or a view of the memory it views (the in-process ring across
        ``instrument()`` calls), not a new ring: no other mapping can be at its address while
        ``other`` lives."""
        return other is not None and self._address == other._address and self._size == other._size

    def find(self, tid: int, hint: int = -1) -> int:
        """Index of ``tid``'s slot (``hint`` first), -1 if the thread has none yet."""
        n, read, data = self.nslots, _TID.unpack_from, self._bytes
        if 0 <= hint < n and read(data, (hint + 1) * SLOT_SIZE + _TID_OFFSET)[0] == tid:
            return hint
        for i in range(PROBE_LEN):
            idx = (tid + i) % n
            if read(data, (idx + 1) * SLOT_SIZE + _TID_OFFSET)[0] == tid:
                return idx
        return -1

    def read(self, index: int, tid: int, until_ns: Optional[int] = None) -> Optional[tuple[int, Counters]]:
        """The calling thread's figures from slot ``index`` and the monotonic time they are
        at (now, or ``until_ns`` if earlier: open intervals are closed there); None if not its slot.
        Raises EndPassed if ``until_ns`` is earlier and the thread took the GIL again after it (its
        counters hold hand-offs made after that time), BusySlot if no read was consistent.

        Only for the caller's own slot: a writer writes it only on this thread's GIL
        hand-offs, which cannot happen while it runs this, except between two bytecodes:
        the clock read and the slot read are made again until no hand-off (a move of the
        slot's seq) came between them, so the figures never include one made after the
        time they are said to be at.
        """
        data, offset = self._bytes, (index + 1) * SLOT_SIZE
        for _ in range(SNAPSHOT_TRIES):
            seq = _U64.unpack_from(data, offset)[0]
            now_ns = time.monotonic_ns()
            read_seq, owner, flags, wait, hold, acq, convoy, long_waits, wait_start, acquired = _SLOT_HEAD.unpack_from(data, offset)
            if read_seq == seq:
                break
        else:
            raise BusySlot(f"slot {index} changed between every clock read and slot read ({SNAPSHOT_TRIES} tries)")
        if owner != tid:
            return None
        if until_ns is not None and until_ns < now_ns:
            if acquired > until_ns or wait_start > until_ns:
                raise EndPassed(f"slot {index}: a GIL hand-off at {max(acquired, wait_start)} after {until_ns}")
            now_ns = until_ns
        return now_ns, _closed(wait, hold, acq, convoy, long_waits, 0 if flags & SLOT_UNCHECKED else wait_start,
                               acquired, now_ns)

    def slot(self, index: int) -> Slot:
        return self._slots[index]

    def snapshot(self, index: int) -> Slot:
        """A consistent copy of another thread's slot (seqlock: retried while being written).

        Raises BusySlot if every one of ``SNAPSHOT_TRIES`` reads met a write (a writer
        holds a slot for ~100 ns): a reader never spins for ever on a broken slot.
        """
        live = self._slots[index]
        for _ in range(SNAPSHOT_TRIES):
            seq = live.seq
            copy = Slot.from_buffer_copy(live)
            if not seq & 1 and live.seq == seq:
                return copy
        raise BusySlot(f"slot {index} was being written during {SNAPSHOT_TRIES} reads (seq {live.seq})")

    def holds_since(self, since_ns: int) -> tuple[list[Hold], bool]:
        """Recorded holds that ended after ``since_ns``, oldest first, and whether the log
        reached back that far (False: older ones were overwritten, or written meanwhile).

        Reads newest to oldest and stops at the first hold that ended by ``since_ns``
        (releases are serialized: the log is in time order).
        """
        data, base = self._bytes, (self.nslots + 1) * SLOT_SIZE
        written = _U64.unpack_from(data, _HOLDS_WRITTEN_OFFSET)[0]
        found, complete, i = [], written <= HOLD_LOG_LEN, written - 1
        while i >= 0 and i >= written - HOLD_LOG_LEN:
            pos = i % HOLD_LOG_LEN
            start, end, tid = _HOLD.unpack_from(
                data, base + pos // HOLDS_PER_PAGE * SLOT_SIZE + pos % HOLDS_PER_PAGE * _HOLD.size)
            if end <= since_ns:
                complete = True
                break
            found.append((i, Hold(start, end, tid, i)))
            i -= 1
        now_written = _U64.unpack_from(data, _HOLDS_WRITTEN_OFFSET)[0]
        oldest_intact = now_written - HOLD_LOG_LEN + 1  # the writer may be overwriting the one before
        if found and found[-1][0] < oldest_intact:
            complete = False
        return [h for i, h in reversed(found) if i >= oldest_intact], complete

    def location(self, index: int) -> Optional[Location]:
        """Where the holder of hold ``index`` (:attr:`Hold.index`) was when it released the GIL;
        None if that hold's location is not (or no longer, or not yet wholly) in the ring."""
        if index < 0:
            return None
        live = LocationRecord.from_buffer(self._bytes, self._locations + index % LOC_LEN * SLOT_SIZE)
        done = 2 * index + 2
        if live.seq != done:
            return None
        copy = LocationRecord.from_buffer_copy(live)
        if live.seq != done:  # overwritten while copied
            return None
        return location_of(copy)

    def threads(self) -> Iterator[Slot]:
        """Consistent copies of every occupied slot."""
        for i, live in enumerate(self._slots):
            if live.tid:
                copy = self.snapshot(i)
                if copy.tid:
                    yield copy

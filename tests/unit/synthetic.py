"""Synthetic rings: the bytes the BPF side would write, built in Python for unit tests."""

from __future__ import annotations

import ctypes
from typing import Iterator

from otel_gil import ring


def ring_bytes(nslots: int = 64) -> bytearray:
    """A ring's bytes as the collector would hand them over: header set, slots empty."""
    data = bytearray(ring.SLOT_SIZE * ring.entries(nslots))
    header = ring.Header.from_buffer(data)
    header.magic, header.layout_version, header.slot_size = ring.MAGIC, ring.LAYOUT_VERSION, ring.SLOT_SIZE
    header.nslots, header.clock_id = nslots, ring.CLOCK_MONOTONIC
    header.long_wait_ns, header.convoy_ns = 1_000_000, 5_000_000
    header.hold_record_ns = ring.HOLD_RECORD_NS
    del header
    return data


def make_ring(nslots: int = 64) -> ring.Ring:
    return ring.Ring.from_bytes(ring_bytes(nslots))


def slot_for(r: ring.Ring, tid: int, index: int | None = None) -> ring.Slot:
    """Claim a slot for ``tid`` where the writers would (the first free one, or its own, from
    its home on; or ``index``): another thread's whose home it shares stays its own."""
    if index is None:
        index = next(i % r.nslots for i in range(tid, tid + ring.PROBE_LEN) if r.slot(i % r.nslots).tid in (0, tid))
    s = r.slot(index)
    ctypes.memset(ctypes.addressof(s), 0, ring.SLOT_SIZE)
    s.tid = tid
    return s


def record_wait(s: ring.Slot, start: int, end: int, blocker: int, long_wait_ns: int = 1_000_000,
                held_ns: int | None = None, forced: bool = False) -> None:
    """What the BPF side does on an acquisition that followed a wait (``held_ns``: held by
    any thread meanwhile, the whole wait unless given)."""
    wait = end - start
    s.wait_ns += wait
    s.hist[ring.hist_bucket(wait)] += 1
    s.acquisitions += 1
    if wait >= 5_000_000:
        s.convoy_waits += 1
    if wait >= long_wait_ns:
        lw = s.ring[s.long_waits % ring.RING_LEN]
        lw.start_ns, lw.end_ns, lw.blocker_tid = start, end, blocker
        lw.held_ns = wait if held_ns is None else held_ns
        lw.flags = ring.WAIT_FORCED if forced else 0
        s.long_waits += 1


def record_hold(s: ring.Slot, start: int, end: int, long_hold_ns: int = 1_000_000) -> None:
    """What the BPF side does on a release that closed a hold."""
    s.hold_ns += end - start
    if end - start >= long_hold_ns:
        lh = s.hold_ring[s.long_holds % ring.RING_LEN]
        lh.start_ns, lh.end_ns = start, end
        s.long_holds += 1


def exit_steps(r: ring.Ring, s: ring.Slot) -> Iterator[None]:
    """What the BPF side does when a thread exits, in its order, pausing after each store
    (as a reader on another CPU may see it): free the slot, then add the thread's figures
    to the header between exits_started and exited_threads."""
    h = r.header
    figures = (s.wait_ns, s.hold_ns, s.acquisitions, s.convoy_waits)
    s.tid, s.flags = 0, 0  # one 8-byte store in BPF
    yield
    h.exits_started += 1
    yield
    for name, value in zip(("exited_wait_ns", "exited_hold_ns", "exited_acquisitions", "exited_convoy_waits"), figures):
        setattr(h, name, getattr(h, name) + value)
        yield
    h.exited_threads += 1
    yield


def exit_thread(r: ring.Ring, s: ring.Slot) -> None:
    """A whole exit, as a reader sees it once the exiting thread is done."""
    for _ in exit_steps(r, s):
        pass


def log_hold(r: ring.Ring, tid: int, start: int, end: int) -> None:
    """What the BPF side does on a release that closed a hold of at least hold_record_ns."""
    h = r.header
    pos = h.holds_written % ring.HOLD_LOG_LEN
    page = ring.HoldPage.from_address(r._address + (r.nslots + 1 + pos // ring.HOLDS_PER_PAGE) * ring.SLOT_SIZE)
    rec = page.holds[pos % ring.HOLDS_PER_PAGE]
    rec.start_ns, rec.end_ns, rec.tid = start, end, tid
    h.holds_written += 1


def log_location(r: ring.Ring, index: int, frames: list[tuple[str, str, int]], why: int = 0) -> None:
    """What a writer does after logging hold ``index``: where its thread's Python code was
    (``frames``: (function, file, line), innermost first; strings stored as CPython keeps them)."""
    loc = ring.LocationRecord.from_address(r._address + r._locations + index % ring.LOC_LEN * ring.SLOT_SIZE)
    loc.seq = 2 * index + 1
    loc.nframes, loc.why = len(frames), why
    for record, (function, file, line) in zip(loc.frames, frames):
        record.line = line
        for name, text, size, keep_end in (("name", function, ring.LOC_NAME, False), ("file", file, ring.LOC_FILE, True)):
            kind = 1 if max(map(ord, text), default=0) < 256 else 2 if max(map(ord, text)) < 65536 else 4
            data = text.encode({1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind])
            kept = data[-size:] if keep_end and len(data) > size else data[:size]
            setattr(record, f"{name}_kind", kind)
            setattr(record, f"{name}_len", len(text))
            ctypes.memmove(ctypes.addressof(record) + getattr(ring.FrameRecord, name).offset, kept, len(kept))
    loc.seq = 2 * index + 2

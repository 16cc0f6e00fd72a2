"""Decoding slots: open intervals, the long-wait ring, the histogram, slot lookup."""

import pytest

from otel_gil import ring
from synthetic import log_hold, log_location, make_ring, record_hold, record_wait, slot_for


def test_counters_close_open_intervals_at_now():
    r = make_ring()
    s = slot_for(r, 1234)
    s.wait_ns, s.hold_ns, s.acquisitions = 100, 200, 3
    s.acquired_ns = 1_000
    assert ring.counters(s, 1_500) == ring.Counters(100, 700, 3, 0, 0)
    s.acquired_ns, s.wait_start_ns = 0, 1_000
    assert ring.counters(s, 1_250) == ring.Counters(350, 200, 3, 0, 0)
    assert ring.counters(s, 900).wait_ns == 100  # a clock read before the interval opened


def test_own_read_never_counts_a_hand_off_after_its_time(monkeypatch):
    """A GIL switch may come between the clock read and the slot read (any bytecode): the
    thread released, waited 30 ms and took the GIL back. Read at the first clock value, the
    slot's closed wait would be 30 ms that had not happened yet (the soak's impossible
    spans, issue 22); the read is made again, at a time after the hand-off."""
    r = make_ring()
    s = slot_for(r, 1234)
    s.hold_ns, s.acquisitions, s.acquired_ns = 0, 1, 1_000
    clock = iter([2_000, 35_000_000, 35_000_100, 35_000_200])

    def monotonic_ns() -> int:
        now = next(clock)
        if now == 2_000:  # the switch, right after the clock read: what the writer does
            s.seq += 2
            record_hold(s, 1_000, 3_000)
            s.seq += 2
            record_wait(s, 3_000, 34_000_000, blocker=1)
            s.acquired_ns = 34_000_000
        return now

    monkeypatch.setattr(ring.time, "monotonic_ns", monotonic_ns)
    now, counters = r.read(1234 % r.nslots, 1234)
    assert now == 35_000_000
    assert counters == ring.Counters(33_997_000, 2_000 + 1_000_000, 2, 1, 1)
    assert r.read(1234 % r.nslots, 1234, until_ns=34_500_000) == (34_500_000, ring.Counters(33_997_000, 502_000, 2, 1, 1))
    assert r.read(1234 % r.nslots, 4321) is None  # not this thread's slot


def test_long_waits_since_returns_new_ones_oldest_first():
    r = make_ring()
    s = slot_for(r, 7)
    for i in range(3):
        record_wait(s, i * 10_000_000, i * 10_000_000 + 2_000_000, blocker=99)
    waits, dropped = ring.long_waits_since(s, 1)
    assert [w.start_ns for w in waits] == [10_000_000, 20_000_000]
    assert dropped == 0 and {w.blocker_tid for w in waits} == {99}


def test_long_waits_ring_overflow_is_counted():
    r = make_ring()
    s = slot_for(r, 7)
    n = ring.RING_LEN + 5
    for i in range(n):
        record_wait(s, i * 10_000_000, i * 10_000_000 + 1_000_000, blocker=i)
    waits, dropped = ring.long_waits_since(s, 0)
    assert dropped == 5
    assert len(waits) == ring.RING_LEN
    assert [w.blocker_tid for w in waits] == list(range(5, n))


def test_long_holds_since_and_overflow():
    s = slot_for(make_ring(), 7)
    record_hold(s, 0, 500_000)  # short: counted, not listed
    for i in range(ring.RING_LEN + 2):
        record_hold(s, (i + 1) * 10_000_000, (i + 1) * 10_000_000 + 2_000_000)
    holds, dropped = ring.long_holds_since(s, 0)
    assert dropped == 2 and len(holds) == ring.RING_LEN
    assert holds[0] == (30_000_000, 32_000_000) and holds[-1][1] - holds[-1][0] == 2_000_000
    assert ring.long_holds_since(s, s.long_holds) == ([], 0)


def test_hist_quantile_is_the_upper_bound_of_the_bucket():
    s = slot_for(make_ring(), 7)
    for wait in [1_000] * 90 + [50_000_000] * 10:
        record_wait(s, 0, wait, blocker=1)
    assert ring.hist_quantile(s.hist, 0.5) == 1024  # 1 us lands in [512, 1024)
    assert ring.hist_quantile(s.hist, 0.9) == 1024
    assert ring.hist_quantile(s.hist, 0.99) == 1 << 26  # 50 ms lands in [2^25, 2^26)
    assert ring.hist_quantile([0] * ring.HIST_BUCKETS, 0.5) == 0


@pytest.mark.parametrize("wait_ns, bucket", [(0, 0), (1, 0), (2, 1), (3, 1), (1023, 9), (1024, 10), (5_000_000, 22), (2**40, 31)])
def test_hist_bucket_is_floor_log2_clamped(wait_ns, bucket):
    assert ring.hist_bucket(wait_ns) == bucket


def test_find_follows_open_addressing_and_hint():
    r = make_ring(nslots=64)
    slot_for(r, 64 * 3 + 5)  # occupies home index 5
    slot_for(r, 64 * 7 + 5, index=6)  # collided, went to the next slot
    assert r.find(64 * 3 + 5) == 5
    assert r.find(64 * 7 + 5) == 6
    assert r.find(64 * 7 + 5, hint=6) == 6
    assert r.find(64 * 7 + 5, hint=5) == 6  # a stale hint is checked, not trusted
    assert r.find(12345) == -1


def test_snapshot_and_threads_skip_free_slots():
    r = make_ring()
    slot_for(r, 10).hold_ns = 5
    slot_for(r, 11).hold_ns = 6
    assert sorted((s.tid, s.hold_ns) for s in r.threads()) == [(10, 5), (11, 6)]


def test_snapshot_of_a_slot_stuck_mid_write_gives_up():
    r = make_ring()
    s = slot_for(r, 10)
    s.seq = 7  # a lost increment left it odd
    with pytest.raises(ring.BusySlot):
        r.snapshot(10 % r.nslots)


def test_bad_magic_or_layout_is_refused():
    data = bytearray(ring.SLOT_SIZE * 4)
    with pytest.raises(ring.LayoutError, match="magic"):
        ring.Ring.from_bytes(data)
    header = ring.Header.from_buffer(data)
    header.magic, header.layout_version, header.slot_size, header.nslots = ring.MAGIC, 99, ring.SLOT_SIZE, 3
    del header
    with pytest.raises(ring.LayoutError, match="upgrade"):
        ring.Ring.from_bytes(data)


def test_hold_log_reads_back_to_a_time_and_says_when_it_could_not():
    r = make_ring(8)
    for i in range(ring.HOLD_LOG_LEN + 10):  # wrapped: the first 10 are gone
        log_hold(r, 100 + i % 3, i * 1000, i * 1000 + 500)
    holds, complete = r.holds_since(5_000_000)
    assert complete and [h.start_ns for h in holds] == [i * 1000 for i in range(5000, ring.HOLD_LOG_LEN + 10)]
    holds, complete = r.holds_since(0)
    assert not complete and len(holds) == ring.HOLD_LOG_LEN - 1  # the oldest slot may be being rewritten
    assert holds[0].start_ns == 11_000 and holds[0].tid == 100 + 11 % 3


def test_held_during_clips_holds_to_the_wait():
    holds = [ring.Hold(0, 10, 1), ring.Hold(12, 20, 2), ring.Hold(25, 40, 1)]
    ends = [h.end_ns for h in holds]
    assert ring.held_during(holds, ends, 5, 30) == {1: 5 + 5, 2: 8}
    assert ring.held_during(holds, ends, 40, 50) == {}


def test_a_location_reads_back_as_written_cut_where_it_is_long():
    r = make_ring()
    log_hold(r, 7, 1_000, 2_000_000)
    long_path = "/srv/" + "d" * 200 + "/stats.py"
    frames = [("Stats.compute_stats", "/srv/app/stats.py", 42), ("λ.<locals>.naïve", long_path, 7),
              ("x" * 100, "/srv/😀/f.py", 0)]
    log_location(r, 0, frames)
    holds, _ = r.holds_since(0)
    assert holds == [ring.Hold(1_000, 2_000_000, 7, 0)]
    where = r.location(holds[0].index)
    assert where.missing == ()
    assert where.frames[0] == ring.Frame("Stats.compute_stats", "/srv/app/stats.py", 42)
    assert where.frames[1].function == "λ.<locals>.naïve" and where.frames[1].line == 7
    assert where.frames[1].file.startswith("…") and long_path.endswith(where.frames[1].file[1:])
    assert where.frames[2] == ring.Frame("x" * ring.LOC_NAME + "…", "/srv/😀/f.py", None)


def test_a_location_not_wholly_written_or_overwritten_is_none():
    r = make_ring()
    log_location(r, 3, [("f", "f.py", 1)])
    assert r.location(3) is not None
    assert r.location(3 + ring.LOC_LEN) is None  # its entry holds hold 3's, not this one's
    record = ring.LocationRecord.from_address(r._address + r._locations + 3 * ring.SLOT_SIZE)
    record.seq -= 1  # being written
    assert r.location(3) is None
    assert r.location(-1) is None


def test_why_a_location_lacks_frames_is_named():
    r = make_ring()
    log_location(r, 0, [], why=1 << ring.LOC_HOLDER | 1 << ring.LOC_NO_LINE)
    assert r.location(0) == ring.Location((), ("holder", "no_line"))

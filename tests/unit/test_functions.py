"""Hold time by function (otel_gil_collector.functions) on hand-made holds and locations."""

from otel_gil import ring
from otel_gil_collector import functions

SPIN = ring.Location((ring.Frame("spin", "/srv/a.py", 15), ring.Frame("main", "/srv/a.py", 30)), ())
STATS = ring.Location((ring.Frame("Stats.compute", "/srv/stats.py", 42),), ())
NO_FRAME = ring.Location((), ("no_frame",))


def hold(index: int, start_ms: float, end_ms: float, tid: int = 7) -> ring.Hold:
    return ring.Hold(int(start_ms * 1e6), int(end_ms * 1e6), tid, index)


def test_holds_sum_by_innermost_frame_within_the_window():
    holds = [hold(0, 0, 5), hold(1, 6, 16), hold(2, 20, 23, tid=8), hold(3, 30, 31), hold(4, 40, 42), hold(5, 50, 60)]
    locations = {0: SPIN, 1: STATS, 2: SPIN, 3: NO_FRAME, 4: None}  # 4: gone; 5: never read
    p = functions.profile(holds, locations, since_ns=int(2e6), until_ns=int(55e6))
    assert [(f.where(), f.hold_ns, f.holds, f.longest_ns, f.tids) for f in p.functions] == [
        ("Stats.compute (/srv/stats.py:42)", 10_000_000, 1, 10_000_000, {7}),
        ("spin (/srv/a.py:15)", 3_000_000 + 3_000_000, 2, 5_000_000, {7, 8}),  # the first clipped to the window
    ]
    assert p.unlocated_ns == {"no_frame": 1_000_000, functions.GONE: 2_000_000 + 5_000_000}
    assert p.logged_ns == 3_000_000 + 10_000_000 + 3_000_000 + 1_000_000 + 2_000_000 + 5_000_000


def test_an_unknown_line_is_shown_as_such():
    f = functions.profile([hold(0, 0, 1)], {0: ring.Location((ring.Frame("f", "/x.py", None),), ("no_line",))})
    assert [x.where() for x in f.functions] == ["f (/x.py:?)"]
    assert f.functions[0].where(basename=True) == "f (x.py:?)"  # top's narrow column

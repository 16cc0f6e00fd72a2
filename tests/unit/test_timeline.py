"""The timeline page, from a synthetic capture: one row per active thread, bars where the holds and waits were."""

import re

from otel_gil import ring
from otel_gil_collector import timeline
from otel_gil_collector.attach import ThreadTrace
from otel_gil_collector.report import Capture

MS = 1_000_000


def capture(threads: int) -> Capture:
    traces = {}
    for tid in range(100, 100 + threads):
        t = ThreadTrace(tid, name=f"worker<{tid}>")
        t.counters = ring.Counters(wait_ns=tid * MS, hold_ns=(200 - tid) * MS, acquisitions=3, convoy_waits=0, long_waits=1)
        t.holds = [(1000 * MS, 1050 * MS)]
        t.waits = [ring.Wait(1000 * MS, 1050 * MS, blocker_tid=100)]
        traces[tid] = t
    traces[999] = ThreadTrace(999, name="idle")  # never touched the GIL: no row
    report = {"pid": 1, "interpreter": "python3", "duration_s": 2.0, "start_ns": 0, "hold_pct": 1.0, "wait_pct": 2.0}
    holds = [ring.Hold(990 * MS, 1040 * MS, 101), ring.Hold(1040 * MS, 1049 * MS, 102)]  # during every wait
    return Capture(report, traces, [(1000 * MS, {100: (0, 0)}), (2000 * MS, {100: (500 * MS, 0)})], holds)


def test_rows_are_ordered_by_hold_and_geometry_maps_time_to_x():
    g = timeline.geometry(capture(40))
    assert g.rows[0] == 100 and len(g.rows) == 40 and 999 not in g.rows
    assert g.x(0) == timeline.LABEL_W and g.x(2000 * MS) == timeline.LABEL_W + timeline.PLOT_W
    assert g.x(1000 * MS) == timeline.LABEL_W + timeline.PLOT_W / 2
    assert g.y(101) - g.y(100) == timeline.ROW_H


def test_page_has_a_labelled_row_per_thread_and_escapes_names():
    page = timeline.render(capture(40))
    assert len(re.findall(r'class="name">worker&lt;\d+&gt; \d+', page)) == 40
    assert "worker<" not in page
    assert page.count(f'fill="{timeline.HOLD}"><title>') == 40 and page.count(f'fill="{timeline.WAIT}"><title>') == 40
    assert "held the GIL 50ms from +1s" in page
    assert "held meanwhile by worker&lt;101&gt; 101 40ms, worker&lt;102&gt; 102 9ms" in page  # by time held, clipped
    assert "<script" not in page and "http" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")

"""top's frames of a free-threaded process without its GIL, on a fake attachment: each shows the
interval's parked time by kind per thread (what the attachment's totals grew by), threads by
parked time (the real thing: tests/integration/test_report_parks.py)."""

from __future__ import annotations

from types import SimpleNamespace

from otel_gil import ring
from otel_gil_collector.attach import ThreadTrace
from otel_gil_collector.top import Frames

MS = 1_000_000


class FakeAttachment:
    """Polls return the next of ``totals``: {tid: (parked ns by ring.PARK_*, object types' ns, parks)}."""

    def __init__(self, totals: list[dict[int, tuple[tuple[int, ...], dict[str, int], int]]]) -> None:
        self.pid, self.gil_disabled, self.names_from = 42, "gil_disabled: free-threaded", "threading"
        self.plan = SimpleNamespace(interpreter="libpython3.13t.so.1.0")
        self.threads: dict[int, ThreadTrace] = {}
        self.present: set[int] = set()
        self._totals, self._now = iter(totals), 0

    def poll(self) -> int:
        for tid, (parked, types, parks) in next(self._totals).items():
            t = self.threads.setdefault(tid, ThreadTrace(tid, name=f"t{tid}"))
            t.parked, t.parked_types, t.parks = parked, types, parks
        self.present, self._now = set(self.threads), self._now + 1000 * MS
        return self._now


def kinds(stw: int = 0, critical: int = 0, app: int = 0) -> tuple[int, ...]:
    by_kind = [0] * ring.PARK_KINDS
    by_kind[ring.PARK_STW], by_kind[ring.PARK_OBJECT], by_kind[ring.PARK_APP_LOCK] = stw, critical, app
    return tuple(by_kind)


def test_each_frame_shows_what_the_interval_added():
    att = FakeAttachment([
        {1: (kinds(app=50 * MS), {}, 1)},
        {1: (kinds(app=250 * MS), {}, 2), 2: (kinds(critical=30 * MS), {"list": 30 * MS}, 1)},
        {1: (kinds(app=250 * MS), {}, 2), 2: (kinds(stw=5 * MS, critical=130 * MS), {"list": 130 * MS}, 3)},
    ])
    frames = Frames(att)
    first, second = frames.next(), frames.next()
    assert first[0].startswith("otel-gil top: pid 42, last 1.0 s: gil_disabled (a free-threaded build"), first
    assert first[1] == "parked 23 % of the time (summed over threads)", first  # 200 + 30 ms of 1 s
    rows = [line.split() for line in first if line.split()[:1] in (["1"], ["2"])]
    assert rows == [["1", "t1", "-", "-", "200ms", "-", "-", "200ms", "1"],
                    ["2", "t2", "-", "30ms", "-", "-", "-", "30ms", "1", "list", "30ms"]], first
    rows = [line.split() for line in second if line.split()[:1] in (["1"], ["2"])]
    assert rows == [["2", "t2", "5ms", "100ms", "-", "-", "-", "105ms", "2", "list", "100ms"],
                    ["1", "t1", "-", "-", "-", "-", "-", "-", "0"]], second

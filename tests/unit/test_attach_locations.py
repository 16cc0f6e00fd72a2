"""A hold's location, read by ``otel-gil report``/``top``: the writer publishes a hold before it
writes its location (gil_writer.h), so a poll between the two finds none; the next poll reads it
again (a timeline's hold showed no code once in CI). On a fake ring view (the real thing:
tests/integration/test_report.py)."""

from __future__ import annotations

from types import SimpleNamespace

from otel_gil import ring
from otel_gil_collector.attach import Attachment

WHERE = ring.Location((), ())


class FakeView:
    """One hold (index 0) in the first poll; its location's reads answer from ``answers`` in turn."""

    def __init__(self, *answers) -> None:
        self.answers, self.reads, self.polls = list(answers), 0, 0

    def threads(self) -> list:
        return []

    def holds_since(self, since_ns: int):
        self.polls += 1
        return ([ring.Hold(1_000, 2_000_000, 7, 0)] if self.polls == 1 else []), True

    def location(self, index: int):
        assert index == 0
        self.reads += 1
        return self.answers.pop(0)


def attachment(view: FakeView) -> Attachment:
    """An Attachment past its attach, reading ``view``."""
    att = object.__new__(Attachment)
    att._tracer = SimpleNamespace(finish_bootstrap=lambda: None)
    att._traced = SimpleNamespace(view=view)
    att._kinds, att._names_at, att.threads, att.present = None, 0, {}, set()
    att.holds, att.locations, att._unlocated, att.holds_lost = [], {}, [], 0
    att.thread_names = lambda: {7: "hog"}
    return att


def test_a_location_written_after_its_hold_was_read_is_read_at_the_next_poll():
    view = FakeView(None, WHERE)
    att = attachment(view)
    att.poll()
    assert att.locations == {0: None}
    att.poll()
    assert att.locations == {0: WHERE} and view.reads == 2


def test_a_location_still_missing_is_read_again_once_only():
    view = FakeView(None, None)
    att = attachment(view)
    for _ in range(3):
        att.poll()
    assert att.locations == {0: None} and view.reads == 2

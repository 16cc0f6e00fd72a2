"""CI guard on what otel-gil costs: the user-space instructions it adds per calm span (C hooks),
per span with a long wait whose blocker is named, and per GIL hand-off (in-process backend),
counted as bench/instructions.py counts them (exact under valgrind, so the machine's load does
not move them), stay within 10 % of the figures recorded in bench/instructions.json. A change that makes them cheaper records its own
(``bench/instructions.py --record``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import instructions  # noqa: E402


def test_instructions_added_per_span_long_wait_span_and_hand_off_stay_within_ten_percent_of_the_recorded():
    try:
        prefix = instructions.counter("valgrind")  # the recorded figures are its: perf counts hand-offs otherwise
    except SystemExit as missing:  # names what to install
        pytest.fail(str(missing))
    over = instructions.check(prefix, spans=1000, pairs=5000, long_spans=100)
    assert not over, over

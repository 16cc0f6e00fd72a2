"""The C figures and the Python reference, fed the same input, give the same results and
the same verdicts (figures, or none: an invariant broken, or a gil.status instead), so the
twins cannot drift:

- a slot read: ``slot_counters`` (fastspan.h's reader) against ``ring.counters``,
  open intervals closed at the same instant, GIL_SLOT_UNCHECKED waits not counted;
- a span's figures from its thread's counters: ``span_figures`` (span_figures.h,
  what the C hooks compute) against ``spans.own_figures``;
- whole spans through both hook sets on one synthetic ring, the slot, the ring or the
  registration changed while they ran.

The first two through ``figure_checks.c`` beside this file, a module compiled here (test-only code
stays out of the shipped one). Randomized with fixed seeds (a failure names its case), edge cases drawn on purpose: equal
and decreasing counters, sums on either side of the clock slack, every flag.
"""

from __future__ import annotations

import ctypes
import importlib.util
import random
import subprocess
import sysconfig
import threading
import time
from pathlib import Path

import pytest

from otel_gil import ring as ringlib
from otel_gil import spans
from otel_gil.semconv import COLLECTOR_CHANGED, INCONSISTENT, NO_COLLECTOR, REGISTERED, SHARED_THREAD, UNTRACKED
from helpers import ROOT
from synthetic import make_ring, slot_for
from test_spans import FakeRegistration, hooked

CASES = 20_000
SLACK = spans.CLOCK_SLACK_NS
FLAGS = (0, ringlib.SLOT_UNCHECKED, ringlib.SLOT_FORCED, ringlib.SLOT_FORCED | ringlib.SLOT_UNCHECKED,
         ringlib.SLOT_IN_TAKE_GIL, 7)
HERE = Path(__file__).parent  # figure_checks.c


@pytest.fixture(scope="module")
def c():
    if spans._fastspan is None:
        pytest.fail("otel_gil._fastspan is not built: pip install -e . (needs a C compiler and Python.h)")
    return spans._fastspan


@pytest.fixture(scope="module")
def checks(tmp_path_factory):
    """figure_checks.c compiled for this interpreter, imported."""
    built = tmp_path_factory.mktemp("checks") / f"figure_checks{sysconfig.get_config_var('EXT_SUFFIX')}"
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror", f"-I{sysconfig.get_paths()['include']}",
                    f"-I{ROOT / 'otel_gil'}", "-o", str(built), str(HERE / "figure_checks.c")], check=True)
    spec = importlib.util.spec_from_file_location("figure_checks", built)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def near(rng: random.Random, around: int) -> int:
    """A value at, just under, just over, or anywhere near ``around`` (never below 0)."""
    around = max(around, 0)
    return max(0, rng.choice([around, around - 1, around + 1, around - SLACK, around + SLACK,
                              rng.randrange(0, 2 * around + 2)]))


@pytest.mark.parametrize("seed", [1, 2])
def test_a_slot_reads_the_same(checks, seed):
    rng = random.Random(seed)
    r = make_ring()
    s = slot_for(r, 4242)
    for case in range(CASES):
        now = rng.randrange(1, 1 << 50)
        s.wait_ns, s.hold_ns = rng.randrange(1 << 50), rng.randrange(1 << 50)
        s.acquisitions, s.convoy_waits, s.long_waits = rng.randrange(1 << 40), rng.randrange(1 << 20), rng.randrange(99)
        s.wait_start_ns = rng.choice([0, now, near(rng, now), rng.randrange(1, 1 << 50)])
        s.acquired_ns = rng.choice([0, now, near(rng, now), rng.randrange(1, 1 << 50)])
        s.flags = rng.choice(FLAGS)
        expected = ringlib.counters(s, now)
        assert checks.slot_counters(ctypes.addressof(s), now) == tuple(expected), (seed, case, bytes(s)[:96].hex())


def random_own(rng: random.Random, d_hold: int, duration: int) -> spans.Own:
    threads = rng.choice([0, 0, 1, 2, 8, -1])
    budget = duration * max(threads, 0)
    wait_else = rng.randrange(0, budget + 2) if threads else 0
    hold_else = near(rng, budget - wait_else) if threads else 0
    return spans.Own(hold_home=near(rng, d_hold), acquisitions_home=rng.randrange(50),
                     wait_else=wait_else, hold_else=hold_else,
                     acquisitions_else=rng.randrange(50) if threads else 0, convoy_else=rng.randrange(5) if threads else 0,
                     threads_else=threads, switched=rng.random() < 0.5, unseen=rng.random() < 0.1,
                     broken=rng.random() < 0.1, untracked=rng.random() < 0.2)


@pytest.mark.parametrize("seed", [1, 2])
def test_a_spans_figures_are_the_same(checks, seed):
    rng = random.Random(seed)
    verdicts = set()
    for case in range(CASES):
        duration = rng.choice([1, 2, rng.randrange(1, 10**6), rng.randrange(1, 10**10)])
        c0 = tuple(rng.randrange(1 << 45) for _ in range(5))
        d_wait = rng.randrange(0, duration + 1)
        d_hold = near(rng, duration - d_wait)  # wait + hold around the duration (and its slack)
        deltas = [d_wait, d_hold, rng.randrange(100), rng.randrange(5), rng.randrange(3)]
        if rng.random() < 0.1:  # a counter that went back: never a figure
            deltas[rng.randrange(4)] = -rng.randrange(1, 1000)
        c1 = tuple(max(0, a + d) for a, d in zip(c0, deltas))
        own = None if rng.random() < 0.3 else random_own(rng, d_hold, duration)
        py = spans.own_figures(*(b - a for a, b in zip(c0[:4], c1[:4])), own, False, duration)
        got = checks.span_figures(c0, c1, own, duration)
        why = (seed, case, c0, c1, own, duration, py, got)
        if py is None or "gil.status" in py:  # dropped, or a status: the C hooks leave it to the Python hook
            assert got is None, why
            verdicts.add("python decides" if py is None else py["gil.status"])
            continue
        assert got is not None, why
        wait, hold, acquisitions, convoy, others = got
        shown = {"gil.wait_ms": wait / 1e6, "gil.hold_ms": hold / 1e6, "gil.wait_ratio": wait / duration,
                 "gil.hold_ratio": hold / duration, "gil.acquisitions": acquisitions, "gil.convoy_waits": convoy}
        if own is not None and own.switched:
            shown["gil.others_hold_ms"] = others / 1e6
        else:
            assert others == 0, why
        assert py == shown, why
        verdicts.add("figures")
    assert verdicts == {"figures", "python decides", SHARED_THREAD, UNTRACKED}  # every verdict was met


# What may happen to a span's thread, ring or registration while it runs, as (name, change).
def _counters_grow(rng, reg, s, t0):  # by less than the span's 2 ms (its invariants' edges: the test above)
    s.wait_ns += rng.randrange(800_000)
    s.hold_ns += rng.randrange(800_000)
    s.acquisitions += rng.randrange(10)


def _hold_went_down(rng, reg, s, t0):
    s.hold_ns -= rng.randrange(1, 1000)


def _wait_over_duration(rng, reg, s, t0):
    s.wait_ns += 10_000_000_000


def _unchecked_wait_open(rng, reg, s, t0):
    s.wait_start_ns, s.flags = t0, ringlib.SLOT_UNCHECKED | ringlib.SLOT_FORCED


def _hold_open(rng, reg, s, t0):
    s.acquired_ns = t0


def _generation_changed(rng, reg, s, t0):
    state = reg.state
    reg._publish(state.ring, state.status, state.detail)


def _ring_changed(rng, reg, s, t0):
    reg._publish(make_ring(), REGISTERED, "")


def _unregistered(rng, reg, s, t0):
    reg._publish(None, NO_COLLECTOR, "")


CHANGES = [_counters_grow, _hold_went_down, _wait_over_duration, _unchecked_wait_open, _hold_open,
           _generation_changed, _ring_changed, _unregistered]


def run_span(fast: bool, seed: int, changes: list) -> dict:
    """One span through one hook set, its thread's slot and registration changed as ``changes`` say."""
    rng = random.Random(seed)
    ring = make_ring()
    reg = FakeRegistration(ring)
    s = slot_for(ring, threading.get_native_id())
    s.wait_ns, s.hold_ns, s.acquisitions, s.convoy_waits = 5_000_000, 7_000_000, 3, 1
    with hooked(reg, fast) as (tracer, _, exporter):
        with tracer.start_as_current_span("x"):
            t0 = time.monotonic_ns()
            for change in changes:
                change(rng, reg, s, t0)
            time.sleep(0.002)
        (span,) = exporter.get_finished_spans()
    return dict(span.attributes)


def test_whole_spans_get_the_same_verdicts_from_both_hook_sets(c):
    rng = random.Random(3)
    statuses = set()
    for case in range(300):
        changes = rng.sample(CHANGES, rng.choice([0, 1, 1, 2, 3]))
        if _hold_open in changes and _counters_grow in changes:  # the hold fills the span: more would be a race
            changes.remove(_counters_grow)
        py, fast = run_span(False, case, changes), run_span(True, case, changes)
        why = (case, [f.__name__ for f in changes], py, fast)
        assert set(py) == set(fast), why
        assert py.get("gil.status") == fast.get("gil.status"), why
        exact = {k for k in py if k.endswith("_ms") or k in ("gil.acquisitions", "gil.convoy_waits")}
        exact -= {"gil.hold_ms"} if any(f is _hold_open for f in changes) else set()  # open until each span's end
        assert {k: py[k] for k in exact} == {k: fast[k] for k in exact}, why
        statuses.add(py.get("gil.status"))
    assert statuses >= {None, INCONSISTENT, COLLECTOR_CHANGED, NO_COLLECTOR}, statuses

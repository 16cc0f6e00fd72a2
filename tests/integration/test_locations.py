"""Where the holder was at each logged release, on every CPython build we claim (README's
table), written by both writers into their own rings of one process
(tests/workloads/locations.py): functions of every kind keep the GIL through PyDLL calls
while a victim waits, then a pure-Python loop holds it in switch-interval slices.

Truth: the function's name as its code object gives it (qualified on 3.11+), the file it
was compiled as, the line of the call (of the loop, for the pure-Python slices). A location
is right, absent (its why counted), or a failure: no wrong name or line is tolerated; at
least 90 % of the holds of each case are named (a hold that outlasted its call, released in
the driver because the victim's drop request came late on a loaded machine, is true but
not this case's: it is left out, and most must not be); where both writers logged the same hold
(holds of 1 ms or more whose ends are within 200 µs), their frames agree wherever both read them."""

from __future__ import annotations

import json
import os
import subprocess

from helpers import ROOT

WORKLOAD = ROOT / "tests" / "workloads" / "locations.py"
NAMED = 0.9
# The writers read the clock up to ~100 µs apart on a loaded machine (the hook before the
# release, the probe after the hook's work and a uprobe trap): holds of 1 ms and more are
# the same hold when both ends are that close, shorter ones may be neighbours.
SAME_HOLD_NS = 200_000
PAIRED_NS = 1_000_000


def run(collector, interpreter) -> dict:
    cmd = interpreter.command(WORKLOAD, collector.address)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, **interpreter.env})
    assert done.returncode == 0, f"{cmd} failed:\n{done.stderr}"
    return json.loads(done.stdout)


def holds_of(truth: dict, holds: list[dict]) -> list[dict]:
    """The writer's holds that are this call: the one that held through its PyDLL call (which
    keeps the GIL ``hold_us``, somewhere in the call's time), or every hold inside the loop's run."""
    if truth["case"] == "spin":
        return [h for h in holds if truth["start"] <= h["start"] and h["end"] <= truth["end"]]
    return [h for h in holds if min(h["end"], truth["end"]) - max(h["start"], truth["start"]) >= truth["hold_ns"]]


def check_writer(report: dict, kind: str) -> None:
    holds, named = report["writers"][kind]["holds"], {}
    for truth in report["truth"]:
        lines = truth.get("lines") or [truth["line"]]
        truth["hold_ns"] = report["hold_us"] * 1000
        matched = holds_of(truth, holds)
        assert matched, (kind, truth, "no logged hold")
        for hold in matched:
            case = named.setdefault(truth["case"], [0, 0, 0])
            if hold["frames"] and hold["frames"][0][:2] == report["driver"]:
                case[2] += 1
                continue
            case[1] += 1
            if not hold["frames"]:
                continue
            function, file, line = hold["frames"][0]
            assert (function, file) == (truth["function"], report["file"]), (kind, truth, hold)
            assert line is None or line in lines, (kind, truth, hold)
            if truth["case"] == "deep":  # the three frames outside it: the recursion's line
                assert [tuple(f) for f in hold["frames"][1:]] == [
                    (report["deep_function"], report["file"], report["recurse_line"])] * 3, (kind, hold)
            case[0] += line is not None
    for case, (good, total, outlasted) in named.items():
        assert outlasted < total, (kind, case, outlasted, "holds outlasted their call: most must not")
        assert good >= NAMED * total, (kind, case, good, total, report["writers"][kind]["misses"])


def test_every_kind_of_function_is_named_by_both_writers(collector, interpreter):
    report = run(collector, interpreter)
    for kind in report["writers"]:
        check_writer(report, kind)
    own_holds = [h for h in report["writers"]["inprocess"]["holds"] if h["end"] - h["start"] >= PAIRED_NS]
    pairs = []
    for hold in (h for h in report["writers"]["collector"]["holds"] if h["end"] - h["start"] >= PAIRED_NS):
        same = min(own_holds, key=lambda h: abs(h["end"] - hold["end"]))
        if abs(same["end"] - hold["end"]) < SAME_HOLD_NS and abs(same["start"] - hold["start"]) < SAME_HOLD_NS:
            pairs.append((hold, same))
    assert len(pairs) >= len(report["truth"]), (len(pairs), len(report["truth"]))
    for bpf, own in pairs:
        if bpf["frames"] and own["frames"]:
            assert len(bpf["frames"]) == len(own["frames"]), (bpf, own)
            for (f1, p1, l1), (f2, p2, l2) in zip(bpf["frames"], own["frames"]):
                assert (f1, p1) == (f2, p2) and (l1 == l2 or None in (l1, l2)), (bpf, own)

"""A logged hold's line, where code objects are remade at freed ones' addresses: the in-process
writer remembers the lines it decoded (_inprocess.c's line_of), and must never give a freed code
object's line for the one now at its address (tests/workloads/remade_code.py). Every call's hold
call is at a line of its own; the frame it logged must say that line, on every build of the
verified matrix (line tables: co_lnotab on 3.9, co_linetable's two formats after)."""

from __future__ import annotations

import collections
import json
import os
import subprocess

import pytest

from helpers import ROOT, interpreters

WORKLOAD = ROOT / "tests" / "workloads" / "remade_code.py"


@pytest.mark.parametrize("name", sorted(interpreters()))
def test_a_code_object_remade_at_a_freed_ones_address_is_located_at_its_own_line(name):
    runner = interpreters()[name]
    done = subprocess.run(runner.command(WORKLOAD), capture_output=True, text=True, timeout=120,
                          env={**os.environ, **runner.env})
    assert done.returncode == 0, done.stderr
    calls = json.loads(done.stdout)["calls"]
    reused = collections.Counter(tuple(call["code"]) for call in calls).most_common(1)[0][1]
    assert reused > 1, "no code object and line table were made at a freed pair's addresses: nothing checked"
    logged = [call["logged"] for call in calls]
    assert all(logged), f"calls with no logged hold: {[c for c in calls if not c['logged']]}"
    wrong = [(call["line"], call["logged"][0]) for call in calls
             if call["logged"][0] != ["f", "remade.py", call["line"]]]
    assert not wrong, f"(truth, logged frame) where they differ: {wrong}"

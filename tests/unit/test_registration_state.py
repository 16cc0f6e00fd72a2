"""The registration's ring, status and generation are one value: a span measured while the
registrar thread swaps them pairs a ring with its own status, never with the one before or
after (on 3.9 a thread switch can fall between any two bytecodes of two reads)."""

import json
import subprocess
from pathlib import Path

import pytest

from otel_gil.semconv import REGISTERED

ROOT = Path(__file__).resolve().parents[2]
FLIPS = ROOT / "tests" / "workloads" / "registration_flips.py"
PYTHONS = {"3.9": ROOT / ".venv-matrix" / "3.9" / "bin" / "python"}
SPANS = 4000


@pytest.mark.parametrize("hooks", ["python", "c"])
@pytest.mark.parametrize("version", PYTHONS)
def test_every_span_agrees_with_the_ring_it_was_measured_on(version, hooks):
    python = PYTHONS[version]
    if not python.exists():
        pytest.fail(f"{python} is missing: run 'make matrix' (or 'make test') first")
    done = subprocess.run([str(python), str(FLIPS), str(SPANS), hooks], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    published = {int(generation): tuple(state) for generation, state in report["published"].items()}
    rows = report["spans"]
    assert len(rows) >= SPANS and {row[2] for row in rows} >= {REGISTERED}, len(rows)
    torn = [row for row in rows if published.get(row[0]) != (row[1], row[2])]
    assert not torn, f"{len(torn)} of {len(rows)} snapshots pair a ring with another state's status: {torn[:5]}"
    for generation, serial, status, shown, figures in rows:
        assert shown != REGISTERED, (generation, serial, status)  # a status is set only where there are no figures
        assert figures == (shown is None), (generation, serial, status, shown)
        if status != REGISTERED:  # not measured: the snapshot's own status, nothing else
            assert shown == status, (generation, serial, status, shown)
    measured = [row for row in rows if row[4]]
    assert measured and all(row[2] == REGISTERED and row[1] is not None for row in measured)

"""The benchmarks' ``--baseline`` runs the other checkout's otel_gil: ``python -c`` puts its
working directory first on sys.path, so PYTHONPATH alone, run from this checkout, measured
this checkout twice."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import results  # noqa: E402

WHICH = "import otel_gil; print(otel_gil.__file__)"


def test_a_child_imports_the_checkout_it_is_given(tmp_path, monkeypatch):
    (tmp_path / "otel_gil").mkdir()
    (tmp_path / "otel_gil" / "__init__.py").write_text("")
    monkeypatch.chdir(ROOT)  # where the benchmarks are run from
    done = subprocess.run([sys.executable, "-c", WHICH], capture_output=True, text=True, check=True,
                          **results.python_in(tmp_path))
    assert Path(done.stdout.strip()) == tmp_path / "otel_gil" / "__init__.py"

"""The C span hooks' shortcuts through CPython's layouts (``otel_gil/cpython_layouts.c``) against
the generic paths, on each interpreter of the matrix (3.11's, 3.12's and 3.13's layouts; the
others' generic path). Attribute reads and stores against ``getattr`` and ``setattr``: where
CPython keeps an instance's attributes in its type's shared keys they are read (3.11: and
written) there by an index cached per (type, name); whatever changes the type or the instance
after that (a property, class attribute, ``__getattr__`` or ``__setattr__`` added, another
version tag, a subclass's keys in another order, the instance's own dict by ``vars()`` or
assignment, attributes deleted, more types than the cache holds) must give what ``getattr`` and
``setattr`` give, and reads must go through the layout where it holds (``layout_cases.fast``). An
empty dict filled from a model: as inserting the keys in order would leave it. The cases are
``layout_cases.py``, run by each interpreter against ``layout_checks.c`` built for it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).parent
PYTHONS = {"3.9": ROOT / ".venv-matrix" / "3.9" / "bin" / "python",
           "3.10": ROOT / ".venv-matrix" / "3.10" / "bin" / "python", "3.11": Path(sys.executable),
           "3.12": ROOT / ".venv-matrix" / "3.12" / "bin" / "python",
           "3.13": ROOT / ".venv-matrix" / "3.13" / "bin" / "python"}
LAYOUTS = ("3.11", "3.12", "3.13")  # the versions whose layouts cpython_layouts.c reads
CASES = sorted(line.split("(")[0][4:] for line in (HERE / "layout_cases.py").read_text().splitlines()
               if line.startswith("def case_"))


@pytest.mark.parametrize("version", PYTHONS)
def test_layout_reads_stores_and_fills_are_the_generic_paths(version, tmp_path):
    python = PYTHONS[version]
    if not python.exists():
        pytest.fail(f"{python} is missing: run 'make matrix' (or 'make test') first")
    paths = subprocess.run([str(python), "-c", "import sys, sysconfig; v = sys.version_info; "
                            "print(f'{v[0]}.{v[1]}', sysconfig.get_paths()['include'], "
                            "sysconfig.get_config_var('EXT_SUFFIX'))"],
                           capture_output=True, text=True, check=True).stdout.split()
    assert paths[0] == version, paths
    built = tmp_path / f"layout_checks{paths[2]}"
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror", f"-I{paths[1]}", f"-I{ROOT / 'otel_gil'}",
                    "-o", str(built), str(HERE / "layout_checks.c")], check=True)
    done = subprocess.run([str(python), str(HERE / "layout_cases.py"), str(built)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["known_layout"] == (version in LAYOUTS), report["known_layout"]
    assert sorted(report["cases"]) == CASES
    failed = {name: error for name, error in report["cases"].items() if error is not None}
    assert not failed, "\n".join(failed.values())

"""Test-only C harnesses over otel_gil's headers, built with the system cc."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]


def harness(work: Path, source: str) -> Callable[[str], str]:
    """Compile ``source`` (otel_gil/ on its include path) in ``work``: a function from its stdin to its stdout."""
    (work / "harness.c").write_text(source)
    subprocess.run(["cc", "-O2", "-Wall", "-Werror", f"-I{ROOT / 'otel_gil'}", "-o", str(work / "harness"),
                    str(work / "harness.c")], check=True)
    return lambda stdin: subprocess.run([str(work / "harness")], input=stdin, capture_output=True, text=True,
                                        check=True).stdout

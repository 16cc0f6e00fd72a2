"""bench/RESULTS.md: each benchmark owns one "## name" section and rewrites only that."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
OUT = Path(__file__).resolve().parent / "out"


def machine() -> str:
    """One line naming the machine and date, for each section's header."""
    return (f"{platform.node()}: {os.cpu_count()} cores, Linux {platform.release()}, "
            f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}")


def python_version(python: str) -> str:
    """The version of the interpreter at ``python`` (a benchmark's child), e.g. 3.13.5."""
    return subprocess.run([python, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True, text=True,
                          check=True).stdout.strip()


def quartiles(ratios: list[float]) -> str:
    """The first and third quartiles of a benchmark's per-round ratios, in per cent."""
    q = statistics.quantiles(ratios, n=4)
    return f"{100 * q[0]:.1f}-{100 * q[2]:.1f} %"


def python_in(checkout: Path) -> dict:
    """subprocess arguments under which ``python -c`` imports otel_gil from ``checkout``: it is the
    working directory too, since ``-c`` puts that first on sys.path, before PYTHONPATH."""
    return {"cwd": str(checkout), "env": {**os.environ, "PYTHONPATH": str(checkout)}}


def write_section(name: str, body: str) -> None:
    """Replace (or append) the section ``## name`` of RESULTS.md with ``body``."""
    section = f"## {name}\n\n{body.strip()}\n"
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmarks\n"
    start = text.find(f"## {name}\n")
    if start >= 0:
        end = text.find("\n## ", start + 1)
        text = text[:start] + section + (text[end:] if end >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    RESULTS.write_text(text)

"""Helpers shared by the test modules: running workloads, reading reports and Jaeger."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "tests" / "workloads" / "scenarios.py"
LOAD = ROOT / "examples" / "load.py"
NOBODY = 65534
sys.path.insert(0, str(ROOT / "examples"))
import stack  # noqa: E402  (examples/stack.py: how the collector, Jaeger and the apps start)


def within(measured: float, truth: float, rel: float = 0.05, abs_ms: float = 0.5) -> bool:
    """The tolerance of the ground-truth tests: 5 % or 0.5 ms, whichever is larger."""
    return abs(measured - truth) <= max(rel * truth, abs_ms)


@dataclass
class Runner:
    """How to run a workload: which interpreter, inside what, with which import path."""

    python: str
    repo: Path = ROOT  # the checkout as the runner sees it
    env: dict = field(default_factory=lambda: {"PYTHONPATH": str(ROOT)})
    prefix: tuple[str, ...] = ()  # e.g. a sandbox that drops privileges


MATRIX = ("3.9", "3.10", "3.11", "3.12", "3.13")
BACKENDS = ("collector", "inprocess")  # the two writers of the slot layout


def interpreters() -> dict[str, Runner]:
    """Every CPython build the figures are verified on (see README): pyenv builds with
    symbols in .venv-matrix/ (``make matrix``), and Debian's stripped LTO+PGO python3.11."""
    runners = {f"pyenv-{v}": Runner(str(ROOT / ".venv-matrix" / v / "bin" / "python")) for v in MATRIX}
    site = sysconfig.get_paths()["purelib"]  # the main venv: Python 3.11, like Debian's
    runners["debian-3.11"] = Runner("/usr/bin/python3.11", env={"PYTHONPATH": f"{ROOT}:{site}"})
    return runners


def run_scenario(
    name: str, socket_path: str, *options: str, runner: "Runner | None" = None, backend: str = "collector"
) -> dict:
    """Run tests/workloads/scenarios.py in a new process with ``backend`` (OTEL_GIL_BACKEND) and return its JSON report."""
    runner = runner or Runner(sys.executable)
    if not os.path.exists(runner.python) and not runner.prefix:
        raise AssertionError(f"{runner.python} is missing: run 'make matrix' (or 'make test') first")
    cmd = [*runner.prefix, runner.python, str(runner.repo / SCENARIOS.relative_to(ROOT))]
    env = {**os.environ, **runner.env, "OTEL_GIL_BACKEND": backend}
    done = subprocess.run([*cmd, name, socket_path, *options], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, f"{cmd} failed:\n{done.stderr}"
    report = json.loads(done.stdout)
    report["stderr"] = done.stderr
    return report


def span(report: dict, name: str) -> dict:
    found = [s for s in report["spans"] if s["name"] == name]
    assert len(found) == 1, f"expected one span {name!r}, got {[s['name'] for s in report['spans']]}"
    return found[0]




def drive(url: str, routes: str, requests: int, concurrency: int = 4) -> None:
    """Bounded load on loopback with examples/load.py; fails the test on any HTTP error."""
    done = subprocess.run(
        [sys.executable, str(LOAD), "--url", url, "--routes", routes, "--requests", str(requests),
         "--concurrency", str(concurrency), "--max-seconds", "120"],
        capture_output=True, text=True, timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def server_spans(service: str, operation: str, count: int) -> list[dict]:
    """At least ``count`` server spans of ``operation`` from Jaeger (waits for batched exports)."""
    spans = [s for s in stack.wait_for_spans(service, operation, count) if s["tags"].get("span.kind") == "server"]
    assert len(spans) >= count, f"{len(spans)} server spans of {operation} in Jaeger, expected {count}"
    return spans


def median_tag(spans: list[dict], key: str) -> float:
    values = [s["tags"][key] for s in spans if key in s["tags"]]
    assert len(values) == len(spans), f"{len(spans) - len(values)} spans lack {key}"
    return statistics.median(values)

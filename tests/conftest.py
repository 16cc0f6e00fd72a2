"""Shared fixtures: one real collector per test session, and workload runners."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "tests" / "workloads" / "scenarios.py"


class Collector:
    def __init__(self, socket_path: str, log_path: Path, proc: subprocess.Popen) -> None:
        self.socket = socket_path
        self.log_path = log_path
        self.proc = proc

    def log(self) -> str:
        return self.log_path.read_text()


@pytest.fixture(scope="session")
def collector() -> Collector:
    """The real eBPF collector (needs root: without it this fails, it does not skip)."""
    if os.geteuid() != 0:
        pytest.fail("the collector tests need root (eBPF): run them with sudo, as CI does")
    workdir = Path(tempfile.mkdtemp(prefix="otel-gil-test-"))
    os.chmod(workdir, 0o755)  # the unprivileged test connects as nobody
    sock = str(workdir / "otel-gil.sock")
    log_path = workdir / "collector.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "collector", "--socket", sock, "-v"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 60
    while not os.path.exists(sock):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the collector did not start:\n{log_path.read_text()}")
        time.sleep(0.1)
    yield Collector(sock, log_path, proc)
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("the collector did not stop on SIGTERM")
    assert proc.returncode == 0, log_path.read_text()
    shutil.rmtree(workdir, ignore_errors=True)


def run_scenario(name: str, socket_path: str, *options: str, sandbox: "Sandbox | None" = None) -> dict:
    """Run tests/workloads/scenarios.py in a new process and return its JSON report."""
    if sandbox is None:
        cmd = [sys.executable, str(SCENARIOS)]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
    else:
        cmd = [*sandbox.prefix, sandbox.python, str(sandbox.repo / SCENARIOS.relative_to(ROOT))]
        env = {**os.environ, **sandbox.env}
    done = subprocess.run([*cmd, name, socket_path, *options], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, f"{cmd} failed:\n{done.stderr}"
    report = json.loads(done.stdout)
    report["stderr"] = done.stderr
    return report


def span(report: dict, name: str) -> dict:
    found = [s for s in report["spans"] if s["name"] == name]
    assert len(found) == 1, f"expected one span {name!r}, got {[s['name'] for s in report['spans']]}"
    return found[0]


NOBODY = 65534


@dataclass
class Sandbox:
    """How to run a workload as uid/gid nobody with no capabilities."""

    prefix: tuple[str, ...]
    python: str
    repo: Path
    env: dict


@pytest.fixture
def nobody() -> Sandbox:
    """The interpreter, its site-packages and this checkout may live under /root: a
    private mount namespace binds them under a directory nobody can read (nothing
    on the host changes; the binds vanish with the workload)."""
    workdir = Path(tempfile.mkdtemp(prefix="otel-gil-nobody-"))
    os.chmod(workdir, 0o755)
    binds = {"prefix": sys.base_prefix, "site": sysconfig.get_paths()["purelib"], "repo": str(ROOT)}
    script = ["set -e"]
    for name, src in binds.items():
        (workdir / name).mkdir()
        script.append(f"mount --bind '{src}' '{workdir / name}'")
    script.append(
        f'exec setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups --inh-caps=-all --bounding-set=-all "$@"'
    )
    yield Sandbox(
        prefix=("unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(script), "nobody"),
        python=str(workdir / "prefix" / "bin" / os.path.basename(os.path.realpath(sys.executable))),
        repo=workdir / "repo",
        env={
            "PYTHONPATH": f"{workdir / 'repo'}:{workdir / 'site'}",
            "LD_LIBRARY_PATH": str(workdir / "prefix" / "lib"),
            "PYTHONNOUSERSITE": "1",
            "HOME": "/nonexistent",
        },
    )
    for name in binds:
        (workdir / name).rmdir()
    workdir.rmdir()

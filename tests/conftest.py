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
def collector(tmp_path_factory) -> Collector:
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


def run_scenario(name: str, socket_path: str, *options: str, prefix: tuple[str, ...] = (), python: str = sys.executable, env: dict | None = None) -> dict:
    """Run tests/workloads/scenarios.py in a new process and return its JSON report."""
    script = str(SCENARIOS) if not prefix else str(Path(env["PYTHONPATH"].split(":")[0]) / SCENARIOS.relative_to(ROOT))
    cmd = [*prefix, python, script, name, socket_path, *options]
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=full_env)
    assert done.returncode == 0, f"{cmd} failed:\n{done.stderr}"
    report = json.loads(done.stdout)
    report["stderr"] = done.stderr
    return report


def span(report: dict, name: str) -> dict:
    found = [s for s in report["spans"] if s["name"] == name]
    assert len(found) == 1, f"expected one span {name!r}, got {[s['name'] for s in report['spans']]}"
    return found[0]


NOBODY = 65534


def as_nobody(workdir: Path) -> tuple[tuple[str, ...], str, dict]:
    """(command prefix, python, env) that run a workload as uid/gid nobody with no capabilities.

    The interpreter, its site-packages and this checkout may live under /root;
    a private mount namespace binds them under ``workdir`` where nobody can read
    them (nothing on the host changes).
    """
    binds = {
        "prefix": sys.base_prefix,
        "site": sysconfig.get_paths()["purelib"],
        "repo": str(ROOT),
    }
    script = ["set -e"]
    for name, src in binds.items():
        (workdir / name).mkdir(parents=True, exist_ok=True)
        script.append(f"mount --bind '{src}' '{workdir / name}'")
    os.chmod(workdir, 0o755)
    script.append(
        f"exec setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups --inh-caps=-all "
        '--bounding-set=-all "$@"'
    )
    prefix = ("unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(script), "nobody-workload")
    python = str(workdir / "prefix" / "bin" / os.path.basename(os.path.realpath(sys.executable)))
    env = {
        "PYTHONPATH": f"{workdir / 'repo'}:{workdir / 'site'}",
        "LD_LIBRARY_PATH": str(workdir / "prefix" / "lib"),
        "PYTHONNOUSERSITE": "1",
        "HOME": "/nonexistent",
    }
    return prefix, python, env

"""What a user installs is enough: a fresh virtualenv gets exactly the README's
``pip install otel-gil ...`` line (otel-gil as pip would pick it from PyPI here: dist/'s
manylinux wheel for this interpreter, ``make wheels``), and the Flask example
runs under ``opentelemetry-instrument`` with OpenTelemetry's defaults (OTLP over gRPC to
localhost:4317, the real Jaeger): its spans arrive there with GIL figures.

pip's downloads are cached in ``${OTEL_GIL_CACHE:-/var/cache/otel-gil}/pip``."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys

import pytest

from helpers import ROOT, built_wheel, drive, server_spans, stack, wheels

PORT = 18099
SERVICE = "flask-fresh-venv"


def readme_install_line() -> list[str]:
    """The README's ``pip install otel-gil ...`` arguments, otel-gil the wheel built for this interpreter."""
    found = re.findall(r"^pip install (otel-gil .*?)\s*(?:#.*)?$", (ROOT / "README.md").read_text(), re.M)
    assert len(found) == 1, f"README.md should have one 'pip install otel-gil ...' line, has {found}"
    wheel = built_wheel(platform.python_version().rsplit(".", 1)[0], platform.machine())
    return [str(wheel) if arg == "otel-gil" else arg for arg in found[0].split()]


def test_readme_install_is_all_a_flask_service_needs(collector, jaeger, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    cache = os.path.join(os.environ.get("OTEL_GIL_CACHE", "/var/cache/otel-gil"), "pip")
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--cache-dir", cache,
                           *readme_install_line()], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    modules = ["otel_gil", *wheels.extension_modules()]
    where = subprocess.run([str(venv / "bin" / "python"), "-c", f"import importlib; [print(importlib.import_module(m)"
                            f".__file__) for m in {modules}]"], capture_output=True, text=True, cwd=tmp_path, check=True)
    paths = where.stdout.split()
    assert len(paths) == len(modules) and all(p.startswith(str(venv)) for p in paths), paths  # the wheel's, not the checkout's

    env = {key: value for key, value in os.environ.items() if not key.startswith(("OTEL_", "PYTHON"))}
    env.update(OTEL_SERVICE_NAME=SERVICE, OTEL_GIL_SOCKET=collector.address,
               OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none")  # Jaeger takes traces only
    argv = [str(venv / "bin" / "opentelemetry-instrument"), str(venv / "bin" / "flask"), "--app", "app", "run",
            "--port", str(PORT)]
    try:
        app = stack.start_web("flask (fresh venv)", argv, ROOT / "examples" / "flask_app", env, PORT,
                              tmp_path / "app.log")
    except stack.StackError as exc:
        pytest.fail(str(exc))
    try:
        drive(app.address, "/io", 20, concurrency=1)
        spans = server_spans(SERVICE, "GET /io", 20)
    finally:
        app.stop()
    assert "not found" not in app.log_text(), app.log_text()[-3000:]
    for span in spans:
        assert "gil.status" not in span["tags"] and span["tags"]["gil.wait_ms"] > 0, span["tags"]
    blockers = {f["value"] for s in spans for log in s.get("logs", []) for f in log["fields"]
                if f["key"] == "gil.blocker.thread.name"}
    assert "metrics-collector" in blockers, blockers

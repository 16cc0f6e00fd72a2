"""A free-threaded build's wheel makes OTLP over HTTP opentelemetry-instrument's default (no
grpcio there): the .pth file setup.py adds on that build, as Python's site runs it at start.
The wheel itself, installed, exporting: tests/wheels/test_wheels.py::test_free_threaded_wheel."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from helpers import ROOT, interpreters

AUTO = "/venv/lib/site-packages/opentelemetry/instrumentation/auto_instrumentation"  # as opentelemetry-instrument sets it
PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"


@pytest.fixture(scope="module")
def built(free_threaded, tmp_path_factory) -> tuple[str, Path]:
    """(the free-threaded python, its build_py output)."""
    python = free_threaded.python
    out = tmp_path_factory.mktemp("build")
    subprocess.run([python, "setup.py", "-q", "build_py", "--build-lib", str(out)], cwd=ROOT, check=True,
                   capture_output=True)
    return python, out


@pytest.mark.parametrize("env, protocol", [
    ({"PYTHONPATH": AUTO}, "http/protobuf"),  # under opentelemetry-instrument: HTTP
    ({"PYTHONPATH": AUTO, PROTOCOL: "grpc"}, "grpc"),  # chosen: kept
    ({}, None),  # not under opentelemetry-instrument: nothing set
])
def test_the_wheels_pth_makes_http_the_default_under_opentelemetry_instrument(built, env, protocol):
    python, out = built
    assert (out / "otel_gil_otlp_http.pth").exists(), sorted(p.name for p in out.iterdir())
    code = f"import os, site; site.addsitedir({str(out)!r}); print(os.environ.get({PROTOCOL!r}))"
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.strip() == str(protocol), done


def test_a_default_builds_wheel_has_no_such_file(tmp_path):
    """gRPC has wheels there: its OTLP stays as OpenTelemetry sets it (3.13's venv: a setuptools
    that reads pyproject.toml's license)."""
    python = interpreters()["pyenv-3.13"].python
    if not Path(python).exists():
        pytest.fail(f"{python} is missing: run 'make matrix' (or 'make test') first")
    subprocess.run([python, "setup.py", "-q", "build_py", "--build-lib", str(tmp_path)], cwd=ROOT, check=True,
                   capture_output=True)
    assert (tmp_path / "otel_gil").is_dir() and not list(tmp_path.glob("*.pth"))

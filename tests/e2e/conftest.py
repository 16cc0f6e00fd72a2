"""End-to-end fixtures: a real Jaeger (built once, cached outside the repo) and the
example apps under opentelemetry-instrument, exporting OTLP to it."""

from __future__ import annotations

import itertools
import shutil
import tempfile
from pathlib import Path

import pytest

from helpers import stack

_ports = itertools.count(18100)


@pytest.fixture(scope="session")
def jaeger():
    workdir = Path(tempfile.mkdtemp(prefix="otel-gil-jaeger-"))
    try:
        service = stack.start_jaeger(workdir / "jaeger.log")
    except stack.StackError as exc:
        pytest.fail(str(exc))
    yield service
    service.stop()
    shutil.rmtree(workdir, ignore_errors=True)


def _apps(collector, backend: str, tmp_path: Path, suffix: str):
    started = []

    def start(framework: str, server: str, service: str, **options) -> stack.Service:
        log = tmp_path / f"{service}.log"
        try:
            svc = stack.start_app(framework, server, next(_ports), f"{service}{suffix}", collector.address, log,
                                  backend=backend, **options)
        except stack.StackError as exc:
            pytest.fail(str(exc))
        started.append(svc)
        return svc

    yield start
    for svc in started:
        svc.stop()


@pytest.fixture
def app(collector, jaeger, backend, tmp_path):
    """app(framework, server, service_name, **options) -> a started example app with this run's backend,
    stopped after the test. The service name gets the backend as a suffix (one Jaeger serves both runs)."""
    yield from _apps(collector, backend, tmp_path, f"-{backend}")


@pytest.fixture
def collector_app(collector, jaeger, tmp_path):
    """Like ``app``, once, with the collector: for what reaches Jaeger's UI and Prometheus, the
    same whichever backend wrote the figures. Service names as given."""
    yield from _apps(collector, "collector", tmp_path, "")

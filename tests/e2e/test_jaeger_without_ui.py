"""A clone with nothing beside it, where Jaeger's release does not download: no UI build
(OTEL_GIL_JAEGER_UI names a missing directory, as ../shared/jaeger-ui is for a user) and the
release off. The demo's Jaeger (scripts/jaeger.sh run) and the image make compose builds
(scripts/images.sh) still start and serve the API (a span sent over OTLP comes back), their
page is Jaeger's placeholder, and the first line of their log says why there is no UI."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from helpers import ROOT, stack

import compose  # scripts/compose.py: the container engine

IMAGE = "docker.io/jaegertracing/jaeger:2.13.0"
ASIDE = "localhost/otel-gil-test/jaeger-registry:2.13.0"  # the registry's IMAGE while the local build has its name
MISSING = "/nonexistent/jaeger-ui/build"
OFFSET = 30000  # this Jaeger's ports: its config's plus this (the session's Jaeger has those)
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture
def no_ui() -> dict[str, str]:
    return {**os.environ, "OTEL_GIL_JAEGER_UI": MISSING, "OTEL_GIL_JAEGER_RELEASE": "none"}


def get(url: str, data: bytes | None = None) -> bytes:
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"} if data else {})
    with OPENER.open(request, timeout=10) as resp:
        assert resp.status == 200, url
        return resp.read()


def span_round_trip(otlp: str, query: str, service: str) -> list[dict]:
    """One span sent to ``otlp`` (OTLP/HTTP JSON), read back from ``query``'s API: its spans."""
    now = time.time_ns()
    span = {"traceId": os.urandom(16).hex(), "spanId": os.urandom(8).hex(), "name": "no-ui", "kind": 2,
            "startTimeUnixNano": str(now - 1_000_000), "endTimeUnixNano": str(now)}
    get(f"{otlp}/v1/traces", json.dumps({"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": service}}]},
        "scopeSpans": [{"spans": [span]}]}]}).encode())
    deadline = time.monotonic() + 20
    while not (spans := stack.jaeger_spans(service, base=query)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return spans


def assert_says_why(first_line: str, prefix: str) -> None:
    assert first_line.startswith(f"{prefix}: no UI: Jaeger 2.13.0 built from its Go module has no UI inside, "
                                 f"no UI build is at {MISSING} (OTEL_GIL_JAEGER_UI names one) and the release is off "
                                 "(OTEL_GIL_JAEGER_RELEASE=none)"), first_line


def test_the_demos_jaeger_without_a_ui_serves_its_api_and_says_why(no_ui, tmp_path):
    ports = {"extensions.jaeger_query.http": 16686, "extensions.jaeger_query.grpc": 16685,
             "extensions.healthcheckv2.http": 13133, "receivers.otlp.protocols.grpc": 4317,
             "receivers.otlp.protocols.http": 4318}
    query, otlp = (f"http://127.0.0.1:{ports[k] + OFFSET}" for k in ("extensions.jaeger_query.http",
                                                                     "receivers.otlp.protocols.http"))
    options = tuple(f"--set={key}.endpoint=127.0.0.1:{port + OFFSET}" for key, port in ports.items())
    try:
        jaeger = stack.start_jaeger(tmp_path / "jaeger.log", options=options, query=query, env=no_ui)
    except stack.StackError as exc:
        pytest.fail(str(exc))
    try:
        assert [s["operationName"] for s in span_round_trip(otlp, query, "no-ui-binary")] == ["no-ui"]
        assert not stack.jaeger_serves_ui(query)
        assert b"This is not the Jaeger UI you are looking for" in get(f"{query}/")
        assert jaeger.proc.poll() is None
    finally:
        jaeger.stop()
    log = jaeger.log_text()
    assert_says_why(log.splitlines()[0], "jaeger.sh")
    assert "panic" not in log.lower(), log


@pytest.fixture
def engine() -> str:
    """Docker or podman, as make compose has it (scripts/engine.sh name)."""
    if os.geteuid() != 0:
        pytest.fail("a container engine needs root: run as root, as CI does")
    return compose.run([str(ROOT / "scripts" / "engine.sh"), "name"], "the container engine").strip()


def recipe(engine: str, image: str) -> str:
    """The recipe images.sh built ``image`` from; "" for the registry's."""
    label = subprocess.run([engine, "image", "inspect", "--format", '{{ index .Config.Labels "org.otel-gil.recipe" }}',
                            image], capture_output=True, text=True, check=True).stdout.strip()
    return "" if label == "<no value>" else label


@contextmanager
def registry_image_aside(engine: str) -> Iterator[None]:
    """The registry's IMAGE, where the engine has it, under another name meanwhile: a local build
    takes its name, and gives it back after."""
    have = subprocess.run([engine, "image", "inspect", IMAGE], capture_output=True).returncode == 0
    pulled = have and recipe(engine, IMAGE) == ""
    if pulled:
        subprocess.run([engine, "tag", IMAGE, ASIDE], check=True)
        subprocess.run([engine, "rmi", IMAGE], capture_output=True, check=True)  # the name only: ASIDE keeps it
    try:
        yield
    finally:
        if pulled:
            subprocess.run([engine, "rmi", "-f", IMAGE], capture_output=True)
            subprocess.run([engine, "tag", ASIDE, IMAGE], check=True)
            subprocess.run([engine, "rmi", ASIDE], capture_output=True, check=True)


def test_the_image_without_a_ui_serves_its_api_and_says_why(engine, no_ui):
    """images.sh builds the image of docker-compose.yml's jaeger service without a UI (its own
    recipe: its archive cached beside the one with the UI), here even where the registry's could
    be pulled (OTEL_GIL_IMAGES_PULL=none); it must not crash as it did (Jaeger panicked at start,
    pointed at an empty UI directory)."""
    images = [str(ROOT / "scripts" / "images.sh"), engine]
    try:
        with registry_image_aside(engine):
            subprocess.run(images, env={**no_ui, "OTEL_GIL_IMAGES_PULL": "none"}, check=True)
            assert recipe(engine, IMAGE), "images.sh left the registry's image: no local build to test"
            log = _serve_and_log(engine)
    finally:
        subprocess.run(images, check=True)  # the image as the rest of the session has it (its archive loaded)
    assert_says_why(log.splitlines()[0], "jaeger")
    assert "panic" not in log.lower(), log


def _serve_and_log(engine: str) -> str:
    """IMAGE in a container: it serves its API and no UI; its log."""
    container = subprocess.run([engine, "run", "-d", "-p", f"127.0.0.1:{16686 + OFFSET}:16686",
                                "-p", f"127.0.0.1:{4318 + OFFSET}:4318", IMAGE],
                               capture_output=True, text=True, check=True).stdout.strip()
    query, otlp = f"http://127.0.0.1:{16686 + OFFSET}", f"http://127.0.0.1:{4318 + OFFSET}"

    def logs() -> str:
        return subprocess.run([engine, "logs", container], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True).stdout

    try:
        deadline = time.monotonic() + 60
        while not stack.http_ok(f"{query}/api/services"):
            running = subprocess.run([engine, "inspect", "--format", "{{.State.Running}}", container],
                                     capture_output=True, text=True).stdout.strip()
            assert running == "true" and time.monotonic() < deadline, f"Jaeger's container did not serve:\n{logs()}"
            time.sleep(0.5)
        assert [s["operationName"] for s in span_round_trip(otlp, query, "no-ui-image")] == ["no-ui"], logs()
        assert not stack.jaeger_serves_ui(query)
        assert b"This is not the Jaeger UI you are looking for" in get(f"{query}/")
        return logs()
    finally:
        subprocess.run([engine, "stop", "-t", "5", container], capture_output=True)
        subprocess.run([engine, "rm", "-f", container], capture_output=True)

"""scripts/jaeger.sh's choice, without the network: Jaeger's release binary (its UI inside) where the
release's files download and its archive's SHA-256 is the one the release lists, else the Go
module's build, serving a UI build where there is one, else saying in one line why there is no UI.
The release is a local one of the real layout (jaeger-2.N.0-linux-ARCH.tar.gz holding
jaeger-2.N.0-linux-ARCH/jaeger, and jaeger-2.N.0.sha256sum.txt), made here and read over file://;
both binaries are scripts that print their command line, in a cache of this test's own."""

from __future__ import annotations

import hashlib
import os
import platform
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from helpers import ROOT

SCRIPT = ROOT / "scripts" / "jaeger.sh"
MODULE = re.search(r"^version=(v1\.(\d+)\.(\d+))", SCRIPT.read_text(), re.M)
RELEASE = f"2.{int(MODULE[2]) - 63}.{MODULE[3]}"  # Jaeger 2.N is Go module v1.(63+N)
MACHINE = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine())  # as the release names them
ARCHIVE = f"jaeger-{RELEASE}-linux-{MACHINE}"
ASSETS = "--set=extensions.jaeger_query.ui.assets_path="


def stub(path: Path, says: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\necho {says} "$@"\n')
    path.chmod(0o755)
    return path


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    """A cache holding a Go build (a stub), no UI build, and the release's files unreachable."""
    stub(tmp_path / "cache" / f"jaeger-{MODULE[1]}" / "jaeger", "module")
    return {**os.environ, "OTEL_GIL_CACHE": str(tmp_path / "cache"), "OTEL_GIL_JAEGER_UI": str(tmp_path / "no-ui"),
            "OTEL_GIL_JAEGER_RELEASE": (tmp_path / "unreachable").as_uri()}


def release(where: Path, listed_sum: str = "") -> str:
    """The release's files in ``where`` (its sums list giving ``listed_sum`` if set): their URL."""
    stub(where / ARCHIVE / "jaeger", "release")
    stub(where / ARCHIVE / "example-hotrod", "hotrod")
    with tarfile.open(where / f"{ARCHIVE}.tar.gz", "w:gz") as tar:
        tar.add(where / ARCHIVE, ARCHIVE)
    digest = listed_sum or hashlib.sha256((where / f"{ARCHIVE}.tar.gz").read_bytes()).hexdigest()
    (where / f"jaeger-{RELEASE}.sha256sum.txt").write_text(f"{'0' * 64} *{ARCHIVE}.zip\n{digest} *{ARCHIVE}.tar.gz\n")
    return where.as_uri()


def jaeger(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done


pytestmark = pytest.mark.skipif(MACHINE is None, reason="Jaeger releases no binary for this machine")


def test_the_release_is_used_where_it_downloads_and_its_sum_is_listed(env, tmp_path):
    env["OTEL_GIL_JAEGER_RELEASE"] = release(tmp_path / "release")
    path = jaeger(env, "path").stdout.strip()
    assert path == str(tmp_path / "cache" / ARCHIVE / "jaeger")
    assert jaeger(env, "ui").stdout == "inside\n"
    run = jaeger(env, "run", "--x")
    assert run.stdout == f"release --config {ROOT / 'scripts' / 'jaeger-config.yaml'} --x\n"  # its own UI: no assets
    assert "no UI" not in run.stderr
    # Cached: it is used without the release's files, unless the release is off.
    env["OTEL_GIL_JAEGER_RELEASE"] = (tmp_path / "gone").as_uri()
    assert jaeger(env, "path").stdout.strip() == path
    env["OTEL_GIL_JAEGER_RELEASE"] = "none"
    assert jaeger(env, "path").stdout.strip() == str(tmp_path / "cache" / f"jaeger-{MODULE[1]}" / "jaeger")


def test_an_archive_whose_sum_the_release_does_not_list_is_not_used(env, tmp_path):
    env["OTEL_GIL_JAEGER_RELEASE"] = url = release(tmp_path / "release", listed_sum="1" * 64)
    assert jaeger(env, "path").stdout.strip().endswith(f"jaeger-{MODULE[1]}/jaeger")
    assert not (tmp_path / "cache" / ARCHIVE).exists()
    ui = jaeger(env, "ui").stdout
    assert ui.startswith("none ") and f"the SHA-256 of {url}/{ARCHIVE}.tar.gz is not the one its release lists" in ui


def test_without_the_release_the_go_build_serves_a_ui_build_where_there_is_one(env, tmp_path):
    ui = tmp_path / "jaeger-ui" / "build"
    (ui / "static").mkdir(parents=True)
    (ui / "index.html").write_text("<div id=\"jaeger-ui-root\"></div>")
    env["OTEL_GIL_JAEGER_UI"] = str(ui)
    assert jaeger(env, "path").stdout.strip().endswith(f"jaeger-{MODULE[1]}/jaeger")
    assert jaeger(env, "ui").stdout == f"assets {ui}\n"
    run = jaeger(env, "run")
    assert run.stdout == f"module --config {ROOT / 'scripts' / 'jaeger-config.yaml'} {ASSETS}{ui}\n", run.stderr


def test_without_a_ui_the_go_build_runs_saying_why_in_one_line(env, tmp_path):
    ui = jaeger(env, "ui").stdout
    assert ui.count("\n") == 1 and ui.startswith("none ")
    # What is missing, each named: the UI inside (a Go build has none), the UI build, the release.
    for missing in (f"Jaeger {RELEASE} built from its Go module has no UI inside", f"no UI build is at {tmp_path / 'no-ui'}",
                    "OTEL_GIL_JAEGER_UI", f"its release did not download from {(tmp_path / 'unreachable').as_uri()}"):
        assert missing in ui, (missing, ui)
    run = jaeger(env, "run", "--x")
    assert run.stdout == f"module --config {ROOT / 'scripts' / 'jaeger-config.yaml'} --x\n"  # no assets: no crash
    assert run.stderr == f"jaeger.sh: no UI: {ui[len('none '):]}"

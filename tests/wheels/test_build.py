"""setup.py's C parts: required where the binary wheels are built (OTEL_GIL_REQUIRE_EXTENSIONS=1,
as make wheels sets it), optional where pip builds the sdist."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

from helpers import DIST, wheels


def pip_wheel(out, **env) -> subprocess.CompletedProcess:
    sdist = DIST / wheels.sdist_name()
    assert sdist.exists(), f"{sdist} is missing: run 'make wheels'"
    return subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(out), str(sdist)],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "CC": "false", **env})


def test_a_wheel_without_its_c_parts_fails_to_build(tmp_path):
    """A compiler that fails every call: the wheel build fails, no wheel comes out."""
    done = pip_wheel(tmp_path, OTEL_GIL_REQUIRE_EXTENSIONS="1")
    assert done.returncode != 0 and not list(tmp_path.glob("*.whl")), done.stdout + done.stderr
    assert "otel_gil._inprocess" in done.stdout + done.stderr, done.stdout + done.stderr


def test_the_sdist_builds_without_them(tmp_path):
    """The same compiler without the requirement: a wheel with no C part (what spans then say: test_wheels)."""
    done = pip_wheel(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = tmp_path.glob("*.whl")
    with zipfile.ZipFile(wheel) as whl:
        assert "otel_gil/ring.py" in whl.namelist() and not [n for n in whl.namelist() if n.endswith(".so")]

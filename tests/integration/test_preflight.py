"""The collector refuses to start without what it needs, in one line naming the fix."""

import os
import subprocess
import sys

import pytest

from otel_gil import protocol

# The DaemonSet's capabilities but CAP_DAC_READ_SEARCH (the chart's before it had it): root's only.
SYS_ADMIN_AND_PTRACE = ("setpriv", "--inh-caps=-all", "--ambient-caps=-all",
                        "--bounding-set=-all,+sys_admin,+sys_ptrace")


@pytest.fixture
def root():
    if os.geteuid() != 0:
        pytest.fail("the collector with some of root's capabilities needs root: run as root, as CI does")


def test_not_root_is_one_clear_line(nobody):
    done = subprocess.run(
        [*nobody.prefix, nobody.python, "-m", "otel_gil_collector", "--socket", "/nonexistent/x.sock"],
        capture_output=True, text=True, timeout=60, cwd="/", env={**nobody.env, "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines == ["otel-gil-collector needs root (or CAP_SYS_ADMIN + CAP_SYS_PTRACE + CAP_DAC_READ_SEARCH): "
                     "run it with sudo"], done.stderr


def test_without_dac_read_search_is_one_clear_line(root, tmp_path):
    """Root with CAP_SYS_ADMIN and CAP_SYS_PTRACE only (the DaemonSet's capabilities before
    CAP_DAC_READ_SEARCH): it says so and exits, rather than serve and fail every app of another uid."""
    done = subprocess.run([*SYS_ADMIN_AND_PTRACE, sys.executable, "-m", "otel_gil_collector", "--socket",
                           str(tmp_path / "x.sock")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "otel-gil-collector lacks CAP_DAC_READ_SEARCH: add it to its capabilities (Kubernetes: securityContext."
        "capabilities.add, as deploy/kubernetes/collector-daemonset.yaml does), or run it as root with all of them"]


PLAN = """
import sys
from otel_gil_collector import probes
try:
    probes.plan(int(sys.argv[1]))
except probes.UnsupportedProcess as exc:
    print(exc.code, exc)
"""


def test_another_uids_files_refused_say_which_capabilities(root, nobody):
    """Planning probes for a process of uid nobody without CAP_DAC_READ_SEARCH (its
    /proc/PID/map_files/ is mode 0500, nobody's): attach_failed, naming the capabilities, not
    the attach that bcc would try next through tracefs (absent in a container)."""
    app = subprocess.Popen([*nobody.prefix, nobody.python, "-c", "import sys; sys.stdin.read()"],
                           stdin=subprocess.PIPE, env={**os.environ, **nobody.env})
    try:
        done = subprocess.run([*SYS_ADMIN_AND_PTRACE, sys.executable, "-c", PLAN, str(app.pid)],
                              capture_output=True, text=True, timeout=60)
    finally:
        app.kill()
        app.wait()
    assert done.returncode == 0, done.stderr
    code, _, message = done.stdout.strip().partition(" ")
    assert code == protocol.ATTACH_FAILED, done.stdout
    assert f"/proc/{app.pid}/map_files/" in message and "Permission denied" in message, message
    assert "CAP_DAC_READ_SEARCH" in message and "collector-daemonset.yaml" in message, message


def test_bad_options_are_refused(nobody):
    done = subprocess.run(
        [*nobody.prefix, nobody.python, "-m", "otel_gil_collector", "--max-threads", "3"],
        capture_output=True, text=True, timeout=60, cwd="/", env={**nobody.env, "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2 and "--max-threads" in done.stderr

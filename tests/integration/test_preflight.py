"""The collector refuses to start without what it needs, in one line naming the fix."""

import subprocess


def test_not_root_is_one_clear_line(nobody):
    done = subprocess.run(
        [*nobody.prefix, nobody.python, "-m", "otel_gil_collector", "--socket", "/nonexistent/x.sock"],
        capture_output=True, text=True, timeout=60, cwd="/", env={**nobody.env, "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines == ["otel-gil-collector needs root (or CAP_SYS_ADMIN + CAP_SYS_PTRACE): run it with sudo"], done.stderr


def test_bad_options_are_refused(nobody):
    done = subprocess.run(
        [*nobody.prefix, nobody.python, "-m", "otel_gil_collector", "--max-threads", "3"],
        capture_output=True, text=True, timeout=60, cwd="/", env={**nobody.env, "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2 and "--max-threads" in done.stderr

"""`otel-gil report --pid` and `otel-gil top --pid`: any running Python process, no
otel_gil inside, per-thread figures within 5 % of what its PyDLL bursts imply, hold time
by function naming the line of the bursts on every build, a timeline whose hog bars sit
where the bursts were (and name that code), and a live view driven in tmux."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from PIL import Image

from helpers import (BURST_NS, OTEL_GIL, ROOT, Runner, check_functions, hog_hold_ok, report_during_bursts,
                     start_target, within)
from otel_gil import ring
from otel_gil_collector import report, timeline

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def test_report_json_against_ground_truth():
    target, _ = start_target()
    try:
        result, truth, progress = report_during_bursts(target, "--duration", "5s")
    finally:
        target.kill()
        target.wait()
    assert "compiling" in progress and "attached to pid" in progress
    assert result["pid"] == target.pid and 4.5 < result["duration_s"] < 6
    by_tid = {t["tid"]: t for t in result["threads"]}
    for t in result["threads"]:
        assert {"tid", "name", "wait_s", "hold_s", "acquisitions", "wait_p50_s", "wait_p99_s"} <= set(t)
    hog = by_tid[truth["tids"]["hog"]]
    assert result["thread_names"] == "threading" and hog["name"] == "gil-hog"
    assert hog_hold_ok(hog["hold_s"] * 1e3, truth), (hog, truth)
    assert hog["long_holds"] == len(truth["bursts"])
    # Each I/O thread waits once per burst, a little over 50 ms: the histogram's bucket is [2^25, 2^26) ns.
    bucket_top = 1 << (ring.hist_bucket(BURST_NS) + 1)
    for i in range(2):
        io = by_tid[truth["tids"][f"io-{i}"]]
        assert io["name"] == truth["names"][f"io-{i}"]
        assert within(io["wait_s"] * 1e3, truth["io_wait_ns"][i] / 1e6, rel=0.05, abs_ms=1.0), (io, truth)
        assert io["wait_p50_s"] == io["wait_p99_s"] == bucket_top / 1e9, io
        assert io["long_waits"] == len(truth["bursts"])
        # Who held the GIL during its waits, by time: the hog, for its bursts.
        assert io["waited_on"][0]["tid"] == truth["tids"]["hog"], io
        assert within(io["waited_on"][0]["s"] * 1e3, truth["hog_hold_ns"] / 1e6), (io, truth)
    assert result["threads"][0]["tid"] == truth["tids"]["hog"]  # sorted by hold: the cause first
    assert result["wait_pct"] > result["hold_pct"] * 1.5  # two threads wait through each burst
    check_functions(result, truth)


def test_report_on_every_interpreter(interpreter):
    """`report` attaches to each build of the matrix whatever its root (a container's),
    names threads as `threading` does (read from the process's memory: CPython names OS
    threads only from 3.14, and /proc cuts names at 15 characters), and measures the hog."""
    target, _ = start_target(bursts=5, runner=interpreter)
    try:
        result, truth, progress = report_during_bursts(target, "--duration", "2s")
    finally:
        target.kill()
        target.wait()
    assert result["thread_names"] == "threading", progress
    names = {t["tid"]: t["name"] for t in result["threads"]}
    assert {role: names.get(tid) for role, tid in truth["tids"].items()} == truth["names"], names
    hog = next(t for t in result["threads"] if t["tid"] == truth["tids"]["hog"])
    assert hog_hold_ok(hog["hold_s"] * 1e3, truth), (hog, truth)
    check_functions(result, truth)


def test_report_on_an_interpreter_replaced_on_disk(tmp_path):
    python = tmp_path / "python3.11"
    shutil.copy2("/usr/bin/python3.11", python)  # Debian's: static, stripped, LTO
    target, _ = start_target(bursts=5, runner=Runner(str(python)))
    try:
        shutil.copy2(python, tmp_path / "new")
        os.replace(tmp_path / "new", python)  # as a package upgrade does
        assert os.readlink(f"/proc/{target.pid}/exe") == f"{python} (deleted)"
        result, truth, progress = report_during_bursts(target, "--duration", "2s")
    finally:
        target.kill()
        target.wait()
    hog = next(t for t in result["threads"] if t["tid"] == truth["tids"]["hog"])
    assert hog["name"] == "gil-hog" and hog_hold_ok(hog["hold_s"] * 1e3, truth), (hog, progress)


def test_report_says_when_the_gil_was_not_located():
    """No GIL hand-off during the capture (every thread blocked): no figures, not zeros."""
    target, _ = start_target()  # idle until SIGUSR1, which never comes
    try:
        done = subprocess.run([*OTEL_GIL, "report", "--pid", str(target.pid), "--duration", "1s", "--json"],
                              capture_output=True, text=True, env=ENV, timeout=60)
    finally:
        target.kill()
        target.wait()
    assert done.returncode == 1 and not done.stdout, done
    assert "gil_not_located" in done.stderr and "Traceback" not in done.stderr, done.stderr


def _screenshot(html: Path, png: Path, width: int, height: int) -> Image.Image:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "chromium is missing: run scripts/setup-host.sh (make test does)"
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--hide-scrollbars", "--force-device-scale-factor=1", f"--user-data-dir={profile}",
             f"--window-size={width},{height}", f"--screenshot={png}", html.as_uri()],
            check=True, capture_output=True, timeout=120,
        )
    return Image.open(png).convert("RGB")


def _is(pixel: tuple[int, int, int], color: str) -> bool:
    want = tuple(int(color[i:i + 2], 16) for i in (1, 3, 5))
    return all(abs(a - b) <= 12 for a, b in zip(pixel, want))


def _row_top(page: str, tid: int) -> int:
    label_y = int(re.search(rf'<text x="[\d.]+" y="(\d+)" class="name">[^<]* {tid}<', page).group(1))
    return label_y - (timeline.ROW_H - 6)


def test_timeline_shows_the_bursts_where_they_were(tmp_path):
    target, _ = start_target()
    html = tmp_path / "gil.html"
    try:
        result, truth, _ = report_during_bursts(target, "--duration", "2.5s", "--timeline", str(html))
    finally:
        target.kill()
        target.wait()
    page = html.read_text()
    g = timeline.Geometry(result["start_ns"], result["start_ns"] + int(result["duration_s"] * 1e9), ())
    hog_y = _row_top(page, truth["tids"]["hog"])
    io_y = _row_top(page, truth["tids"]["io-0"])
    shot = _screenshot(html, tmp_path / "gil.png", timeline.LABEL_W + timeline.PLOT_W + 20, hog_y + 400)
    bursts = truth["bursts"]
    assert len(bursts) == 10 and g.end_ns > bursts[-1][1], "the capture must cover every burst"
    for (t0, t1), after in zip(bursts, bursts[1:] + [None]):
        x = round(g.x((t0 + t1) // 2))
        assert _is(shot.getpixel((x, hog_y + 5)), timeline.HOLD), f"no hog hold bar at x={x} (burst at {t0})"
        assert _is(shot.getpixel((x, io_y + timeline.ROW_H - 5)), timeline.WAIT), f"no I/O wait bar at x={x}"
        if after:
            gap = round(g.x((t1 + after[0]) // 2))  # 100 ms of sleep: nothing holds
            assert not _is(shot.getpixel((gap, hog_y + 5)), timeline.HOLD), f"a hold bar between bursts at x={gap}"
    assert "held the GIL 50" in page  # the hover text of a burst
    function, file, line = truth["hog_code"]
    assert page.count(f"released in {function} ({file}:{line})") == len(bursts), page  # and where it ended


def _tmux(*args: str) -> str:
    return subprocess.run(["tmux", "-L", "otel-gil-test", *args], capture_output=True, text=True).stdout


def _pane_until(predicate, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    screen = ""
    while time.monotonic() < deadline:
        screen = _tmux("capture-pane", "-p", "-t", "top")
        if predicate(screen):
            return screen
        time.sleep(0.2)
    raise AssertionError(f"tmux pane never matched; last screen:\n{screen}")


def _session_gone(timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if subprocess.run(["tmux", "-L", "otel-gil-test", "has-session", "-t", "top"], capture_output=True).returncode:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("quit_key", ["q", "C-c"])
def test_top_in_tmux_shows_the_hog_first_and_quits(quit_key):
    assert shutil.which("tmux"), "tmux is missing: run scripts/setup-host.sh (make test does)"
    target, tids = start_target(bursts=400)  # 60 s of bursts
    target.send_signal(signal.SIGUSR1)
    try:
        command = " ".join([*OTEL_GIL, "top", "--pid", str(target.pid), "--interval", "0.5"])
        _tmux("new-session", "-d", "-s", "top", "-x", "150", "-y", "30", "-e", f"PYTHONPATH={ROOT}", command)
        _pane_until(lambda s: "q quits" in s and re.search(r"^ +\d+ .*%", s, re.M), 60)
        first = _pane_until(lambda s: re.search(r"^ +\d+ .*%", s, re.M), 5)
        time.sleep(1.2)  # two more intervals: the view refreshes in place
        later = _tmux("capture-pane", "-p", "-t", "top")
        _tmux("send-keys", "-t", "top", quit_key)
        assert _session_gone(5), f"top did not quit on {quit_key}:\n{_tmux('capture-pane', '-p', '-t', 'top')}"
    finally:
        _tmux("kill-server")
        target.kill()
        target.wait()
    for screen in (first, later):
        assert "otel-gil top: pid" in screen and "GIL held" in screen, screen
        first_row = re.search(r"^ +(\d+) ", screen.split("hold %", 1)[1], re.M)
        assert int(first_row.group(1)) == tids["hog"], screen
    # Each I/O thread waited on the hog first (three bursts per interval).
    waited_on = later.split("waited on", 1)[1]
    for io in ("io-0", "io-1"):
        row = re.search(rf"^ +{tids[io]} .*", waited_on, re.M)
        assert row and re.search(rf"^ +{tids[io]} \S+ +\S+ \({tids['hog']}\)", row.group(0)), later
    assert first != later, "the view did not refresh"
    # Where the GIL was held: the line of the hog's bursts (held by the hog, ~100 ms an interval).
    held = later.split("held by function", 1)[1]
    assert re.search(r"^ +[\d.]+% +\S+  gil-hog +hog \(report_target\.py:\d+\)$", held, re.M), later


@pytest.mark.parametrize("case, expected", [
    ("no-such-pid", "no process"),
    ("not-python", "is not a Python process"),
    ("not-root", "needs root"),
])
def test_clear_errors(case, expected, nobody):
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        pid = {"no-such-pid": 4_000_000, "not-python": sleeper.pid, "not-root": os.getpid()}[case]
        prefix = list(nobody.prefix) if case == "not-root" else []
        python = nobody.python if case == "not-root" else sys.executable
        env = {**os.environ, **(nobody.env if case == "not-root" else {"PYTHONPATH": str(ROOT)})}
        for command in ("report", "top"):
            done = subprocess.run([*prefix, python, "-m", "otel_gil.cli", command, "--pid", str(pid)],
                                  capture_output=True, text=True, timeout=60, env=env)
            assert done.returncode == 1, done
            assert expected in done.stderr and "Traceback" not in done.stderr, done.stderr
    finally:
        sleeper.kill()
        sleeper.wait()


def test_report_names_threads_that_ended_during_the_capture():
    """Threads that hold the GIL 150 ms each and end within the capture (between two of the
    periodic name reads): named where they are blamed and where they held it."""
    target = subprocess.Popen([sys.executable, str(ROOT / "tests" / "workloads" / "short_target.py")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert target.stdout.readline().startswith("ready")

        def progress(message: str) -> None:  # the hogs start once attached
            if message.startswith("capturing"):
                target.send_signal(signal.SIGUSR1)

        captured = report.capture(target.pid, 1.5, progress=progress)
        truth = json.loads(target.stdout.readline())
    finally:
        target.kill()
        target.wait()
    result = captured.report
    hogs = {tid: name for name, tid in truth["hogs"].items()}
    io = next(t for t in result["threads"] if t["tid"] == truth["io"])
    assert {b["tid"]: b["name"] for b in io["waited_on"]} == hogs, io["waited_on"]
    holders = {name for p in result["functions"]["places"] for name in p["threads"]}
    assert set(hogs.values()) <= holders, result["functions"]["places"]

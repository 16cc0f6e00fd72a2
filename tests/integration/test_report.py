"""`otel-gil report --pid`: any running Python process, no otel_gil inside, per-thread
figures within 5 % of what its PyDLL bursts imply."""

import json
import os
import signal
import subprocess
import sys

from helpers import ROOT, within

TARGET = ROOT / "tests" / "workloads" / "report_target.py"


def test_report_json_against_ground_truth():
    target = subprocess.Popen([sys.executable, str(TARGET)], stdout=subprocess.PIPE, text=True)
    try:
        assert target.stdout.readline().strip() == "ready"
        report = subprocess.Popen(
            [sys.executable, "-m", "otel_gil.cli", "report", "--pid", str(target.pid), "--duration", "5s", "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        for line in report.stderr:  # progress goes to stderr; start the bursts once attached
            if "capturing" in line:
                break
        target.send_signal(signal.SIGUSR1)
        truth = json.loads(target.stdout.readline())
        out, err = report.communicate(timeout=60)
        assert report.returncode == 0, err
        comm = {
            tid: open(f"/proc/{target.pid}/task/{tid}/comm").read().strip() for tid in truth["tids"].values()
        }  # CPython < 3.14 leaves OS thread names as the process's: the report shows what /proc says
    finally:
        target.kill()
        target.wait()
    result = json.loads(out)
    assert result["pid"] == target.pid and 4.5 < result["duration_s"] < 6
    by_tid = {t["tid"]: t for t in result["threads"]}
    for t in result["threads"]:
        assert {"tid", "name", "wait_s", "hold_s", "acquisitions"} <= set(t)
    hog = by_tid[truth["tids"]["hog"]]
    assert hog["name"] == comm[hog["tid"]]
    assert within(hog["hold_s"] * 1e3, truth["hog_hold_ns"] / 1e6), (hog, truth)
    for i in range(2):
        io = by_tid[truth["tids"][f"io-{i}"]]
        assert io["name"] == comm[io["tid"]]
        assert within(io["wait_s"] * 1e3, truth["io_wait_ns"][i] / 1e6, rel=0.05, abs_ms=1.0), (io, truth)
    assert result["threads"][0]["tid"] in (truth["tids"]["hog"], truth["tids"]["io-0"], truth["tids"]["io-1"])
    assert result["wait_pct"] > result["hold_pct"] * 1.5  # two threads wait through each burst

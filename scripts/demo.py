"""The demo: start the collector, run a workload whose GIL behaviour is known, and
print the figures its spans carried.

    sudo make demo            (or: sudo .venv/bin/python scripts/demo.py)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def start_collector(sock: str, log_path: Path) -> subprocess.Popen:
    print(f"starting the collector (log: {log_path})...", flush=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "collector", "--socket", sock],
        cwd=ROOT, stdout=open(log_path, "w"), stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while not os.path.exists(sock):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            sys.exit(f"the collector did not start:\n{log_path.read_text()}")
        time.sleep(0.1)
    return proc


def main() -> int:
    if os.geteuid() != 0:
        sys.exit("demo: the collector is eBPF and needs root: sudo make demo")
    work = Path(tempfile.mkdtemp(prefix="otel-gil-demo-"))
    sock = str(work / "otel-gil.sock")
    collector = start_collector(sock, work / "collector.log")
    try:
        print("running a GIL hog (10 x 50 ms bursts through ctypes.PyDLL) beside a victim thread...", flush=True)
        out = subprocess.run(
            [sys.executable, str(ROOT / "tests" / "workloads" / "scenarios.py"), "hog", sock],
            capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
        ).stdout
        report = json.loads(out)
        print(f"\n{'span':<8} {'thread':<8} {'duration':>10} {'GIL wait':>10} {'GIL hold':>10} {'wait %':>7}  long waits (blocker)")
        for s in report["spans"]:
            a = s["attributes"]
            blockers = {e["attributes"].get("gil.blocker.thread.name", "?") for e in s["events"]}
            print(
                f"{s['name']:<8} {a['thread.name']:<8} {s['duration_ns'] / 1e6:>8.1f}ms {a['gil.wait_ms']:>8.1f}ms "
                f"{a['gil.hold_ms']:>8.1f}ms {100 * a['gil.wait_ratio']:>6.1f}%  {len(s['events'])} ({', '.join(sorted(blockers)) or '-'})"
            )
        truth = report["truth"]
        print(f"\nground truth: hog held {sum(truth['bursts_ns']) / 1e6:.1f} ms, victim had to wait {truth['victim_wait_ns'] / 1e6:.1f} ms")
    finally:
        collector.terminate()
        collector.wait(20)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

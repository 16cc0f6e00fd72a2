"""kill -9 of the collector while wrk drives the Flask example (gunicorn, collector backend):
not one request fails, and the workers' spans get figures again once it is back."""

from __future__ import annotations

import re
import subprocess
import time

from helpers import drive, stack

PORT = 18090


def test_kill_9_under_load_fails_no_request(jaeger, tmp_path):
    sock = str(tmp_path / "gil.sock")
    first = stack.start_collector(sock, tmp_path / "first.log")
    service = "flask-collector-restart"
    app = stack.start_app("flask", "gthread", PORT, service, sock, tmp_path / "app.log", backend="collector")
    second = None
    try:
        url = f"http://127.0.0.1:{PORT}"
        load = subprocess.Popen(["wrk", "-t", "2", "-c", "8", "-d", "10s", f"{url}/io"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        time.sleep(3)
        first.proc.kill()
        first.proc.wait()
        time.sleep(2)
        second = stack.start_collector(sock, tmp_path / "second.log")
        out, _ = load.communicate(timeout=60)
        assert load.returncode == 0, out
        served = int(re.search(r"(\d+) requests in", out).group(1))
        assert served > 50, out
        assert "Non-2xx" not in out and "Socket errors" not in out, out
        time.sleep(3)  # the workers re-register (backoff from 0.5 s)
        since_us = time.time_ns() // 1000
        drive(url, "/io", 40, concurrency=2)
        spans = stack.wait_for_spans(service, "GET /io", 40, since_us=since_us)
        assert len(spans) >= 40 and all("gil.wait_ms" in s["tags"] for s in spans), \
            [s["tags"].get("gil.status") for s in spans]
        assert "registered" in second.log_text()
    finally:
        app.stop()
        first.stop()
        if second is not None:
            second.stop()

"""kill -9 of the collector while wrk drives the Flask example (gunicorn, collector backend):
not one request fails, the workers' spans get figures again once it is back, and every span
around the restart has possible figures or a status saying why it has none."""

from __future__ import annotations

import re
import subprocess
import time

from helpers import drive, stack

FIGURES = ("gil.wait_ms", "gil.hold_ms", "gil.wait_ratio", "gil.acquisitions", "gil.convoy_waits")  # the last two where not 0

PORT = 18090


def test_kill_9_under_load_fails_no_request(jaeger, tmp_path):
    sock = str(tmp_path / "gil.sock")
    first = stack.start_collector(sock, tmp_path / "first.log")
    service = "flask-collector-restart"
    app = stack.start_app("flask", "gthread", PORT, service, sock, tmp_path / "app.log", backend="collector")
    second = None
    try:
        url = f"http://127.0.0.1:{PORT}"
        began_us = time.time_ns() // 1000
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
        # Figures resume: the workers re-register with backoff (0.5 s doubling, after the new
        # collector's few seconds of compiling), so batches are sent until one has figures throughout.
        deadline, statuses = time.monotonic() + 60, None
        while time.monotonic() < deadline:
            since_us = time.time_ns() // 1000
            drive(url, "/io", 20, concurrency=2)
            spans = stack.wait_for_spans(service, "GET /io", 20, since_us=since_us)
            statuses = [s["tags"].get("gil.status", "ok") for s in spans]
            if len(spans) >= 20 and set(statuses) == {"ok"}:
                break
            assert set(statuses) <= {"ok", "no_collector", "pending", "collector_changed"}, statuses
        assert statuses and set(statuses) == {"ok"}, statuses
        assert "registered" in second.log_text()
        around = [s for s in stack.jaeger_spans(service, "GET /io", since_us=began_us) if s["operationName"] == "GET /io"]
        assert len(around) > 50 and {s["tags"].get("gil.status", "ok") for s in around} > {"ok"}, len(around)
        for span in around:
            tags, duration_ms = span["tags"], span["duration"] / 1000  # Jaeger keeps µs: up to 1 µs short
            if "gil.status" in tags:
                assert not [k for k in FIGURES if k in tags], tags
                continue
            assert tags["gil.wait_ms"] + tags["gil.hold_ms"] <= duration_ms + 0.051, (duration_ms, tags)
            assert 0 <= tags["gil.wait_ratio"] <= 1 and 0 <= tags["gil.hold_ms"] <= duration_ms + 0.051, tags
            assert min(tags[k] for k in FIGURES if k in tags) >= 0, tags
    finally:
        app.stop()
        first.stop()
        if second is not None:
            second.stop()


def test_auto_traces_in_process_while_its_collector_is_gone(jaeger, tmp_path):
    """The auto backend (the default): a process the collector traced goes on with in-process
    figures once the collector is killed, and back to the collector when one answers again."""
    sock = str(tmp_path / "gil.sock")
    first = stack.start_collector(sock, tmp_path / "first.log")
    service = "flask-collector-fallback"
    log = tmp_path / "app.log"
    app = stack.start_app("flask", "gthread", PORT + 1, service, sock, log, backend="auto", workers=1)
    second = None
    url = f"http://127.0.0.1:{PORT + 1}"

    def spans_now() -> list[dict]:
        since_us = time.time_ns() // 1000
        drive(url, "/io", 10, concurrency=2)
        return stack.wait_for_spans(service, "GET /io", 10, since_us=since_us)

    def figures_throughout(what: str) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            statuses = [s["tags"].get("gil.status", "ok") for s in spans_now()]
            assert set(statuses) <= {"ok", "collector_changed", "pending"}, (what, statuses)
            if set(statuses) == {"ok"}:
                return
        raise AssertionError(f"{what}: spans never had figures throughout again: {statuses}")

    try:
        figures_throughout("registered")
        first.proc.kill()
        first.proc.wait()
        figures_throughout("collector gone")  # never no_collector: in-process figures
        assert "tracing in-process until it is back" in log.read_text(), log.read_text()[-2000:]
        second = stack.start_collector(sock, tmp_path / "second.log")
        deadline = time.monotonic() + 60
        while "registered" not in second.log_text() and time.monotonic() < deadline:
            spans_now()
        assert "registered" in second.log_text(), second.log_text()[-2000:]
        figures_throughout("collector back")
    finally:
        app.stop()
        first.stop()
        if second is not None:
            second.stop()

"""Async and greenlet services under opentelemetry-instrument, with their instrumentations
from PyPI, 20 requests in flight, spans read back from a real Jaeger: each server span's
``gil.hold_ms`` is its own request's code (tests/workloads/web_truth: the pieces each request
timed, answered with the response), not the loop's or the hub's.

FastAPI (``async def``, ``def`` in anyio's workers, ``gather`` children with spans of their
own), Starlette and Django (async views; sync views Django runs in a thread) on uvicorn's
asyncio loop; Flask and Django on gunicorn's gevent workers; FastAPI on uvloop, whose switches
only 3.14's context watchers see (here: 3.11, so its spans say so and give no hold)."""

from __future__ import annotations

import json
import os
import secrets
import statistics
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import stack
from helpers import ROOT, check_cpu_bound, within

APPS = ROOT / "tests" / "workloads" / "web_truth"
IN_FLIGHT = 20
REQUESTS = 100

# server -> (argv after opentelemetry-instrument, given the port)
SERVERS = {
    "fastapi-uvicorn": lambda port: ["uvicorn", "--port", str(port), "--loop", "asyncio", "fastapi_app:app"],
    "fastapi-uvloop": lambda port: ["uvicorn", "--port", str(port), "--loop", "uvloop", "fastapi_app:app"],
    "starlette-uvicorn": lambda port: ["uvicorn", "--port", str(port), "--loop", "asyncio", "starlette_app:app"],
    "django-uvicorn": lambda port: ["uvicorn", "--port", str(port), "--loop", "asyncio", "truth_site.asgi:application"],
    "flask-gevent": lambda port: ["gunicorn", "-b", f"127.0.0.1:{port}", "-w", "1", "-k", "gevent", "flask_app:app"],
    "django-gevent": lambda port: ["gunicorn", "-b", f"127.0.0.1:{port}", "-w", "1", "-k", "gevent",
                                   "truth_site.wsgi:application"],
}
_ports = iter(range(18300, 18400))


def _pin(pid: int, cpus: set[int]) -> None:
    """Every thread of process ``pid`` (and the threads it starts) onto ``cpus``."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:
            pass


@pytest.fixture
def truth_app(collector, jaeger, backend, tmp_path):
    """truth_app(server) -> a started ground-truth app and its Jaeger service name.

    The app gets a CPU of its own, the load (this process), Jaeger and the collector the
    others: a thread preempted while it holds the GIL holds it past its CPU time, which is
    the requests' truth (tests/workloads/own_time.py)."""
    everywhere = os.sched_getaffinity(0)
    app_cpu = {max(everywhere)}
    assert len(everywhere) >= 2, "the ground truth needs a CPU for the app and one for the rest"
    for pid in (os.getpid(), jaeger.proc.pid, collector.proc.pid):
        _pin(pid, everywhere - app_cpu)
    started = []

    def start(server: str, **env: str) -> tuple[stack.Service, str]:
        port, service = next(_ports), f"{server}-{backend}"
        argv = ["taskset", "-c", str(max(app_cpu)), str(Path(sys.executable).parent / "opentelemetry-instrument"),
                *(str(Path(sys.executable).parent / a) if i == 0 else a for i, a in enumerate(SERVERS[server](port)))]
        env = {**os.environ, "OTEL_SERVICE_NAME": service, "OTEL_TRACES_EXPORTER": "otlp",
               "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_ENDPOINT": stack.OTLP_HTTP,
               "OTEL_METRICS_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none", "OTEL_BSP_SCHEDULE_DELAY": "200",
               "OTEL_GIL_SOCKET": collector.address, "OTEL_GIL_BACKEND": backend,
               "DJANGO_SETTINGS_MODULE": "truth_site.settings",
               "PYTHONPATH": f"{ROOT}:{APPS}:{APPS.parent}", **env}
        try:
            svc = stack.start_web(server, argv, APPS, env, port, tmp_path / f"{server}.log")
        except stack.StackError as exc:
            pytest.fail(str(exc))
        started.append(svc)
        return svc, service

    yield start
    for svc in started:
        svc.stop()
    for pid in (os.getpid(), jaeger.proc.pid, collector.proc.pid):
        _pin(pid, everywhere)


def get(url: str) -> tuple[str, dict]:
    """GET with a trace id of our own (so its server span is found in Jaeger): (trace id, JSON answer)."""
    trace_id = secrets.token_hex(16)
    request = urllib.request.Request(url, headers={"traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"})
    with urllib.request.urlopen(request, timeout=60) as resp:
        return trace_id, json.load(resp)


def load(base: str, route: str, count: int = REQUESTS) -> dict[str, dict]:
    """``count`` requests, IN_FLIGHT at a time: {trace id: answer}."""
    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        return dict(pool.map(lambda _: get(base + route), range(count)))


def traces(service: str, answers: dict[str, dict]) -> dict[str, list[dict]]:
    """The spans Jaeger has of these requests, by trace id (waits until each server span arrived)."""
    found: dict[str, list[dict]] = {}
    for _ in range(60):  # 30 s: exports may be 10 s apart
        found = {}
        for span in stack.jaeger_spans(service, limit=5000):
            if span["traceID"] in answers:
                found.setdefault(span["traceID"], []).append(span)
        if sum(any(s["tags"].get("span.kind") == "server" for s in spans) for spans in found.values()) >= len(answers):
            return found
        time.sleep(0.5)
    pytest.fail(f"{len(found)} of {len(answers)} traces of {service} reached Jaeger")


def server_span(spans: list[dict]) -> dict:
    (span,) = [s for s in spans if s["tags"].get("span.kind") == "server"]
    return span


def check_own_hold(service: str, answers: dict[str, dict]) -> list[dict]:
    """Each request's server span holds its own code's time: in 95 % of them within 5 % or 0.5 ms
    (and at least its CPU time)."""
    found = traces(service, answers)
    spans = {t: server_span(found[t]) for t in answers}
    for span in spans.values():
        assert "gil.status" not in span["tags"], span["tags"]
    off = [(spans[t]["tags"]["gil.hold_ms"], a["own_ns"] / 1e6) for t, a in answers.items()
           if not within(spans[t]["tags"]["gil.hold_ms"], a["own_ns"] / 1e6)]
    errors = [spans[t]["tags"]["gil.hold_ms"] - a["own_ns"] / 1e6 for t, a in answers.items()]
    assert len(off) <= 0.05 * len(answers), (
        f"{service}: {len(off)} of {len(answers)} off their truth (median error {statistics.median(errors):.2f} ms; "
        f"measured, truth): {off[:10]}")
    check_cpu_bound({t: spans[t]["tags"]["gil.hold_ms"] for t in answers}, {t: a["cpu_ns"] for t, a in answers.items()})
    return [s for spans_ in found.values() for s in spans_]


@pytest.mark.parametrize("server, route", [
    ("fastapi-uvicorn", "/own"),
    ("fastapi-uvicorn", "/own_def"),
    ("starlette-uvicorn", "/own"),
    ("django-uvicorn", "/own"),
    ("django-uvicorn", "/own_sync"),
    ("flask-gevent", "/own"),
    ("django-gevent", "/own_sync"),
])
def test_each_request_gets_its_own_hold(truth_app, server, route):
    svc, service = truth_app(server)
    spans = check_own_hold(service, load(svc.address, route))
    others = [s["tags"].get("gil.others_hold_ms") for s in spans if s["tags"].get("span.kind") == "server"]
    # on the loop or the hub, the other requests' code: most of the time a request is in flight
    assert statistics.median(o or 0 for o in others) > 10, others[:10]


def test_gather_children_get_their_own_and_their_parent_both(truth_app):
    svc, service = truth_app("fastapi-uvicorn")
    answers = load(svc.address, "/gather")
    spans = {s["spanID"]: s for s in check_own_hold(service, answers)}
    off = [(spans[i]["tags"]["gil.hold_ms"], ns / 1e6) for a in answers.values() for i, ns in a["children"].items()
           if not within(spans[i]["tags"]["gil.hold_ms"], ns / 1e6)]
    assert len(off) <= 0.05 * 2 * len(answers), off[:10]


def test_the_loops_waits_are_what_held_each_request_up(truth_app):
    """A hog outside any request holds the GIL through PyDLL; requests that keep the loop busy
    wait out every hold in their lifetime: gil.wait_ms within 10 % of the hog's holds there.
    (The app exports its spans once the load is over: its exporter thread holds the GIL too.)"""
    svc, service = truth_app("fastapi-uvicorn", OTEL_BSP_SCHEDULE_DELAY="10000")
    get(svc.address + "/hog?on=1")
    answers = load(svc.address, "/busy")
    holds = get(svc.address + "/hog?on=0")[1]["holds"]
    found = traces(service, answers)
    off = []
    for t in answers:
        span = server_span(found[t])
        lifetime = (span["startTime"] * 1000, (span["startTime"] + span["duration"]) * 1000)
        truth = sum(max(0, min(e, lifetime[1]) - max(s, lifetime[0])) for s, e in holds) / 1e6
        if not within(span["tags"]["gil.wait_ms"], truth, rel=0.10):
            off.append((span["tags"]["gil.wait_ms"], truth))
    assert len(off) <= 0.05 * len(answers), f"{len(off)} of {len(answers)} (measured, truth): {off[:10]}"
    blocked = [f["value"] for t in answers for s in found[t] for log in s.get("logs", []) for f in log["fields"]
               if f["key"] == "gil.blocker.thread.name"]
    assert blocked.count("gil-hog") >= 0.8 * len(blocked), blocked[:20]


def test_uvloop_before_3_14_says_its_spans_share_a_thread(truth_app):
    """uvloop enters its tasks' contexts in C: no hook sees that before 3.14's context watchers.
    Its spans say so, with the loop's waits and no hold, never a shared thread's figure."""
    assert sys.version_info < (3, 14), "this interpreter has context watchers: test uvloop's figures instead"
    svc, service = truth_app("fastapi-uvloop")
    answers = load(svc.address, "/own", 40)
    for t, spans in traces(service, answers).items():
        tags = server_span(spans)["tags"]
        assert tags.get("gil.status") == "shared_thread" and "gil.hold_ms" not in tags and "gil.wait_ms" in tags, tags

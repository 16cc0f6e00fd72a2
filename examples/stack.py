"""Start and stop the example stack (collector, Jaeger, an instrumented app) and read
spans back from Jaeger's HTTP API. Used by the demo (scripts/demo.py), the
benchmarks and the tests, so that each piece is started one way only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
JAEGER_QUERY = "http://127.0.0.1:16686"
OTLP_HTTP = "http://127.0.0.1:4318"
PROMETHEUS = "http://127.0.0.1:9090"
TAIL_SAMPLING = EXAMPLES / "compose" / "gil-tail-sampling.yaml"  # keeps every GIL-bound trace
BIN = Path(sys.executable).parent


class StackError(RuntimeError):
    """A part of the stack did not come up; the message includes its log."""


@dataclass
class Service:
    name: str
    proc: subprocess.Popen
    log: Path
    address: str  # where it listens: a URL, or the collector's socket path

    def stop(self, timeout: float = 20) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def _wait(service: Service, ready, timeout: float) -> Service:
    deadline = time.monotonic() + timeout
    while not ready():
        if service.proc.poll() is not None or time.monotonic() > deadline:
            service.stop()
            raise StackError(f"{service.name} did not come up:\n{service.log_text()[-4000:]}")
        time.sleep(0.1)
    return service


def http_ok(url: str) -> bool:
    """Whether ``url`` answers 200 within 2 s."""
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except (OSError, urllib.error.URLError):
        return False


def start_collector(
    socket_path: str, log: Path, *options: str, timeout: float = 60, nofile: Optional[tuple[int, int]] = None
) -> Service:
    """The real collector (root), from this checkout, with the current interpreter;
    ``options`` go to its command line, ``nofile`` sets its fd limits (soft, hard)."""
    limit = ("prlimit", f"--nofile={nofile[0]}:{nofile[1]}") if nofile else ()
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [*limit, sys.executable, "-m", "otel_gil_collector", "--socket", socket_path, "-v", *options],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
        )
    return _wait(Service("collector", proc, log, socket_path), lambda: os.path.exists(socket_path), timeout)


def _binary(script: str, what: str, env: Optional[dict] = None) -> str:
    """Path of a tool scripts/SCRIPT gets (built from its Go module, or Jaeger's release) on first use
    (minutes; progress on stderr), with ``env`` as its environment."""
    done = subprocess.run([str(ROOT / "scripts" / script), "path"], stdout=subprocess.PIPE, text=True, env=env)
    if done.returncode != 0:
        raise StackError(f"building {what} failed (see the output above)")
    return done.stdout.strip()


def jaeger_up() -> bool:
    return http_ok(f"{JAEGER_QUERY}/api/services")


@dataclass(frozen=True)
class JaegerUI:
    """Where scripts/jaeger.sh's Jaeger gets its web UI: "inside" its binary (Jaeger's release),
    "assets" (the UI build at ``detail``, which it serves) or "none" (``detail`` says why)."""

    source: str
    detail: str = ""

    def __str__(self) -> str:
        return {"inside": "its release binary, its UI inside",
                "assets": f"built from its Go module, serving the UI build at {self.detail}",
                "none": f"without a UI: {self.detail}"}[self.source]


def jaeger_ui() -> JaegerUI:
    """``scripts/jaeger.sh ui``: where the Jaeger that start_jaeger runs gets its UI (the binary built
    or downloaded first)."""
    done = subprocess.run([str(ROOT / "scripts" / "jaeger.sh"), "ui"], stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise StackError("scripts/jaeger.sh ui failed (see the output above)")
    source, _, detail = done.stdout.strip().partition(" ")
    return JaegerUI(source, detail)


def jaeger_serves_ui(base: str = JAEGER_QUERY) -> bool:
    """Whether the Jaeger at ``base`` serves its UI at / (not its placeholder page)."""
    try:
        with urllib.request.urlopen(f"{base}/", timeout=5) as resp:
            return b'id="jaeger-ui-root"' in resp.read()
    except (OSError, urllib.error.URLError):
        return False


def start_jaeger(log: Path, timeout: float = 60, tail_sampling: bool = False, options: tuple[str, ...] = (),
                 query: str = JAEGER_QUERY, env: Optional[dict] = None) -> Service:
    """Jaeger on loopback (``scripts/jaeger.sh run``: scripts/jaeger-config.yaml and its UI, else a first
    line in ``log`` that says why it has none); with ``tail_sampling``, its traces pipeline samples as the
    compose stack's collector does (TAIL_SAMPLING). ``options`` go to its command line (e.g. --set of its
    endpoints: its API then answers at ``query``), ``env`` is its environment."""
    _binary("jaeger.sh", "Jaeger", env)  # built or downloaded first, with its progress on the console
    if http_ok(f"{query}/api/services"):
        raise StackError(f"something already answers on {query}: stop it first")
    argv = [str(ROOT / "scripts" / "jaeger.sh"), "run"]
    if tail_sampling:
        argv += ["--config", str(TAIL_SAMPLING)]
    with open(log, "w") as out:
        proc = subprocess.Popen([*argv, *options], stdout=out, stderr=subprocess.STDOUT, env=env)
    return _wait(Service("jaeger", proc, log, query), lambda: http_ok(f"{query}/api/services"), timeout)


def prometheus_up() -> bool:
    return http_ok(f"{PROMETHEUS}/-/ready")


def start_prometheus(workdir: Path, rule_files: list[Path], evaluation_interval: str = "15s",
                     timeout: float = 60) -> Service:
    """Prometheus on loopback, in ``workdir``: apps push metrics to its OTLP receiver
    (``start_app(metrics=True)``; job = service.name), ``rule_files`` are evaluated."""
    binary = _binary("prometheus.sh", "Prometheus")
    if prometheus_up():
        raise StackError(f"something already answers on {PROMETHEUS}: stop it first")
    config = workdir / "prometheus.yml"
    config.write_text(json.dumps({  # JSON is YAML
        "global": {"evaluation_interval": evaluation_interval},
        "rule_files": [str(path.resolve()) for path in rule_files],
    }))
    argv = [binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address={urllib.parse.urlsplit(PROMETHEUS).netloc}", "--web.enable-otlp-receiver"]
    log = workdir / "prometheus.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    return _wait(Service("prometheus", proc, log, PROMETHEUS), prometheus_up, timeout)


def prometheus_api(path: str, *, base: str = PROMETHEUS, **query: str):
    """The ``data`` of a Prometheus API answer (Prometheus at ``base``), e.g. ``prometheus_api("query", query="up")``."""
    url = f"{base}/api/v1/{path}?{urllib.parse.urlencode(query)}"
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.load(resp)["data"]


def app_command(framework: str, server: str, port: int, workers: int = 2, preload: bool = False) -> tuple[list[str], Path]:
    """(argv, cwd) of an example app under opentelemetry-instrument. server: dev, sync or gthread
    (gunicorn), or uwsgi (pre-fork in C: --master, 2 threads per worker; ``preload=False`` adds
    --lazy-apps, the app loaded in each worker, else --py-call-uwsgi-fork-hooks); for the fastapi one, uvicorn (its asyncio loop)."""
    instrument = [str(BIN / "opentelemetry-instrument")]
    bind = f"127.0.0.1:{port}"
    if framework == "fastapi":
        return instrument + [str(BIN / "uvicorn"), "--port", str(port), "--loop", "asyncio", "app:app"], EXAMPLES / "async_app"
    if server == "dev":
        if framework == "flask":
            return instrument + [str(BIN / "flask"), "--app", "app", "run", "--port", str(port)], EXAMPLES / "flask_app"
        return instrument + [sys.executable, "manage.py", "runserver", "--noreload", bind], EXAMPLES / "django_app"
    target = {"flask": "app:app", "django": "gilsite.wsgi"}[framework]
    cwd = EXAMPLES / ("flask_app" if framework == "flask" else "django_app")
    if server == "uwsgi":
        argv = instrument + [str(BIN / "uwsgi"), "--http-socket", bind, "--master", "--processes", str(workers),
                             "--threads", "2", "--enable-threads", "--die-on-term", "--module", target]
        # With the app in the master, its threads (OpenTelemetry's exporters among them) may hold
        # the GIL when uWSGI forks: a worker forked then waits for it for ever unless CPython's
        # fork hooks run (seen once in CI: a worker that never served).
        return argv + (["--py-call-uwsgi-fork-hooks"] if preload else ["--lazy-apps"]), cwd
    argv = instrument + [str(BIN / "gunicorn"), "-b", bind, "-w", str(workers), "-k", server, "--threads", "4"]
    return argv + (["--preload"] if preload else []) + [target], cwd


def start_app(
    framework: str, server: str, port: int, service_name: str, socket_path: str, log: Path,
    hog: bool = True, workers: int = 2, preload: bool = False, metrics: bool = False, timeout: float = 60,
    backend: str = "auto", python_hooks: bool = False,
) -> Service:
    """An example app exporting spans to Jaeger and, with ``metrics``, metrics to Prometheus every second;
    with ``python_hooks``, otel_gil's Python span hooks alone (OTEL_GIL_NO_EXTENSIONS=1)."""
    argv, cwd = app_command(framework, server, port, workers, preload)
    env = {
        **os.environ,
        "OTEL_SERVICE_NAME": service_name,
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_ENDPOINT": OTLP_HTTP,
        "OTEL_METRICS_EXPORTER": "otlp" if metrics else "none",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": f"{PROMETHEUS}/api/v1/otlp/v1/metrics",
        "OTEL_METRIC_EXPORT_INTERVAL": "1000",
        "OTEL_LOGS_EXPORTER": "none",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "OTEL_GIL_SOCKET": socket_path,
        "OTEL_GIL_BACKEND": backend,
        "EXAMPLE_GIL_HOG": "1" if hog else "0",
        "DJANGO_SETTINGS_MODULE": "gilsite.settings",
        "PYTHONPATH": str(ROOT),
        **({"OTEL_GIL_NO_EXTENSIONS": "1"} if python_hooks else {}),
    }
    return start_web(f"{framework}/{server}", argv, cwd, env, port, log, timeout)


def start_web(name: str, argv: list[str], cwd: Path, env: dict, port: int, log: Path, timeout: float = 60) -> Service:
    """A web app on 127.0.0.1:``port``, up once its /health answers."""
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    return _wait(Service(name, proc, log, url), lambda: http_ok(f"{url}/health"), timeout)


def jaeger_spans(service: str, operation: Optional[str] = None, limit: int = 2000, since_us: int = 0,
                 base: str = JAEGER_QUERY) -> list[dict]:
    """Spans of ``service`` from the /api/traces of the Jaeger at ``base`` (started after ``since_us``, epoch µs),
    ``tags`` as a dict."""
    query = {"service": service, "limit": str(limit), "lookback": "1h"}
    if since_us:
        query["start"] = str(since_us)
    if operation:
        query["operation"] = operation
    with urllib.request.urlopen(f"{base}/api/traces?{urllib.parse.urlencode(query)}", timeout=30) as resp:
        data = json.load(resp)["data"]
    spans = []
    for trace in data:
        for span in trace["spans"]:
            span["tags"] = {t["key"]: t["value"] for t in span.get("tags", [])}
            span["process"] = trace["processes"].get(span["processID"], {})
            spans.append(span)
    return spans


def wait_for_spans(service: str, operation: str, count: int, timeout: float = 30, since_us: int = 0,
                   base: str = JAEGER_QUERY) -> list[dict]:
    """Poll the Jaeger at ``base`` until ``count`` spans of ``operation`` arrived (exports are batched)."""
    deadline = time.monotonic() + timeout
    while True:
        spans = jaeger_spans(service, operation, since_us=since_us, base=base)  # whole traces: their gil.wait spans too
        if sum(s["operationName"] == operation for s in spans) >= count or time.monotonic() > deadline:
            return spans
        time.sleep(0.5)

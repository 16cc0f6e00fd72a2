"""docker-compose.yml for real: the whole stack in a real container engine (podman here, Docker
where its daemon answers), started once for this module as make compose starts it
(scripts/compose.py), under a project name and host ports of its own, with compose-calm.yml's
hog-free Flask app beside the two apps, without the load service (the tests send every request,
each in a trace whose id they chose) and with 5 % of the calm traces kept by tail sampling.
Checks run in this file's order and share the stack; the last ones stop the collector, then
remove the stack with make compose-down."""

from __future__ import annotations

import os
import re
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from helpers import ROOT, binomial_bounds, stack

import compose  # scripts/compose.py

HOGS = compose.APPS  # compose service -> (service name in Jaeger, /io span name): the apps with their GIL hog
CALM = "flask-calm"  # compose-calm.yml's app, without the hog
APPS = {**HOGS, CALM: ("flask-gil-calm", "GET /io")}
PORTS = {"jaeger": 26686, "prometheus": 29090, **{app: 28000 + i for i, app in enumerate(APPS)}}
PROJECT = "otel-gil-test"
SAMPLE_PERCENT = 5
DECIDED_S = 15  # the tail sampling's decision_wait (5 s) and the batches after it
EXPORT_S = 17  # the apps' metric export interval (15 s) and Prometheus' intake
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture(scope="module")
def project():
    if os.geteuid() != 0:
        pytest.fail("the compose stack needs root (a container engine, the privileged collector): run as root, as CI does")
    project = compose.Stack(name=PROJECT, files=(compose.COMPOSE_FILE, Path(__file__).with_name("compose-calm.yml")),
                            ports=PORTS, sample_percent=SAMPLE_PERCENT)
    services = ("gil-collector", "otel-collector", "jaeger", "prometheus", *APPS)
    try:
        try:
            project.up(services)
        except compose.StackError as exc:
            pytest.fail(f"the compose stack did not come up: {exc}")
        register_every_worker(project, tuple(APPS))
        yield project
    finally:
        project.down()  # also after a failed start


def register_every_worker(project: compose.Stack, services: tuple[str, ...], timeout: float = 90) -> None:
    """Requests until the collector traces every gunicorn worker of ``services``: a worker registers
    on its first span, and its spans say gil.status=pending until it did (tail sampling does not
    keep those as GIL-bound)."""
    deadline = time.monotonic() + timeout
    while True:
        located = located_pids(project)
        waiting = {s: pids for s in services if (pids := worker_pids(project, s) - located)}
        if not waiting:
            return
        if time.monotonic() > deadline:
            service, pids = next(iter(waiting.items()))
            pytest.fail(str(project.failed("gil-collector", f"{service}'s workers {sorted(pids)} (host pids) "
                                           f"not traced within {timeout:.0f} s")))
        for service in waiting:
            send(project, service, 8, 4, route="/health")
        time.sleep(0.5)


def send(project: compose.Stack, service: str, count: int, concurrency: int, route: str = "/io") -> set[str]:
    """``count`` GETs of the service's ``route``, each with a traceparent of a new trace id: those ids."""
    url = project.url(service) + route

    def one(trace_id: str) -> None:
        request = urllib.request.Request(url, headers={"traceparent": f"00-{trace_id}-{os.urandom(8).hex()}-01"})
        with OPENER.open(request, timeout=60) as resp:
            resp.read()

    ids = [os.urandom(16).hex() for _ in range(count)]
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, ids))
    return set(ids)


def traces(project: compose.Stack, name: str, since_us: int) -> dict[str, list[dict]]:
    """Jaeger's traces of service ``name`` started after ``since_us``: trace id -> spans."""
    found: dict[str, list[dict]] = {}
    for span in stack.jaeger_spans(name, since_us=since_us, limit=5000, base=project.url("jaeger")):
        found.setdefault(span["traceID"], []).append(span)
    return found


def wait_for_traces(project: compose.Stack, name: str, ids: set[str], since_us: int, may_drop: int = 0,
                    timeout: float = 60) -> dict:
    """Jaeger's traces of ``name`` once every one of ``ids`` is there, or all but ``may_drop``
    once the tail sampling had time to decide on them all (5 s after a trace's first span,
    then the batch), or at ``timeout``."""
    start = time.monotonic()
    while True:
        found = traces(project, name, since_us)
        missing, waited = len(ids - found.keys()), time.monotonic() - start
        if not missing or (missing <= may_drop and waited >= DECIDED_S) or waited >= timeout:
            return found
        time.sleep(1)


class CalmIo:
    """Server spans of a hog app's /io that waited at most half their time, counted from now by
    the app's own ``gil.wait_ratio`` histogram in Prometheus. Most such requests wait out the
    hog, but one in a hundred or so falls in its pauses (seen: 2 of 300, wait ratios 0.39-0.45
    and no wait of a switch interval): no GIL-bound trace by the policy's figures, it may be
    dropped. How many there were bounds how many a test may miss, from figures the sampler
    never saw."""

    def __init__(self, project: compose.Stack, service: str) -> None:
        self.base, self.job = project.url("prometheus"), HOGS[service][0]
        self.all0, self.calm0 = self._count("+Inf"), self._count("0.5")

    def _count(self, le: str) -> int:
        query = f'sum(gil_wait_ratio_bucket_total{{job="{self.job}",http_route=~"/?io",le="{le}"}})'
        result = stack.prometheus_api("query", base=self.base, query=query)["result"]
        return int(float(result[0]["value"][1])) if result else 0

    def spans(self, sent: int, timeout: float = 90) -> int:
        """How many of the ``sent`` requests since waited at most half their time, once the
        histogram counted them all and then stood still for an export period (each worker
        exports every 15 s: earlier requests' spans a worker had not exported by the start
        are counted too, which only loosens the bound)."""
        deadline = time.monotonic() + timeout
        while self._count("+Inf") - self.all0 < sent:
            assert time.monotonic() < deadline, f"{self.job}: not all {sent} /io spans in its gil.wait_ratio histogram"
            time.sleep(2)
        previous, counted = -1, self._count("+Inf")
        while counted != previous:
            time.sleep(EXPORT_S)
            previous, counted = counted, self._count("+Inf")
        return self._count("0.5") - self.calm0


def gil_bound(spans: list[dict]) -> bool:
    """What the tail sampling keeps whatever the rate: a gil.wait span, or a server span that waited half its time."""
    return any(s["operationName"] == "gil.wait" or (s["tags"].get("span.kind") == "server"
                                                   and s["tags"].get("gil.wait_ratio", 0) >= 0.5) for s in spans)


def server_span(spans: list[dict], service: str) -> dict:
    return next(s for s in spans if s["operationName"] == APPS[service][1] and s["tags"].get("span.kind") == "server")


def now_us() -> int:
    return time.time_ns() // 1000


def located_pids(project: compose.Stack) -> set[int]:
    """Host pids whose GIL the collector traces, as its log says."""
    log = project.logs("gil-collector", lines=5000)
    return {int(pid) for pid in re.findall(r"pid (\d+): GIL located, tracing every hand-off", log)}


def worker_pids(project: compose.Stack, service: str) -> set[int]:
    """Host pids of the processes that serve the service's requests: the children of its
    container's main process (gunicorn's workers), else that process itself (a single-process server)."""
    main = project.container_pid(service)
    return {int(pid) for pid in Path(f"/proc/{main}/task/{main}/children").read_text().split()} or {main}


def test_both_apps_spans_carry_the_collectors_figures(project):
    """Spans of each app reach Jaeger through the OpenTelemetry Collector with gil.* figures, and
    its gunicorn workers are traced by the collector (privileged, pid: host), registered over the
    socket volume: the collector logs their host pids."""
    since = now_us()
    calm = {service: CalmIo(project, service) for service in HOGS}
    sent = {service: send(project, service, 20, 4) for service in HOGS}
    for service, ids in sent.items():
        may_drop = calm[service].spans(len(ids))
        found = wait_for_traces(project, HOGS[service][0], ids, since, may_drop)
        missing = ids - found.keys()
        if len(missing) > may_drop:
            pytest.fail(str(project.failed(service, f"{len(missing)} of its {len(ids)} traces never reached Jaeger "
                                                    f"({may_drop} waited too little to be kept by the sampler)")))
        for trace_id in found.keys() & ids:
            tags = server_span(found[trace_id], service)["tags"]
            assert "gil.status" not in tags and tags["gil.wait_ms"] + tags["gil.hold_ms"] > 0, tags
        blockers = [s["tags"].get("gil.blocker.thread.name") for spans in found.values() for s in spans
                    if s["operationName"] == "gil.wait"]
        assert "metrics-collector" in blockers, (service, blockers[:20])  # the hog, named across containers
        workers = worker_pids(project, service)
        assert workers <= located_pids(project), project.failed("gil-collector", f"{service}'s workers {workers} untraced")


def test_tail_sampling_keeps_every_gil_bound_trace(project):
    """400 requests, 100 of them GIL-bound (the hog app's /io) and 300 calm (the hog-free app's):
    every GIL-bound trace reaches Jaeger (all of the hog app's but those its own figures say
    waited too little: CalmIo), and of the calm ones that the policy does not keep anyway, the
    share kept is SAMPLE_PERCENT within the binomial bound."""
    since = now_us()
    calm_io = CalmIo(project, "flask-app")
    bound = send(project, "flask-app", 100, 4)
    calm = send(project, CALM, 300, 2)
    may_drop = calm_io.spans(len(bound))
    kept_bound = wait_for_traces(project, HOGS["flask-app"][0], bound, since, may_drop)
    time.sleep(10)  # the calm traces' decisions: decision_wait (5 s) after their first span, then the batch
    kept_calm = traces(project, APPS[CALM][0], since)
    missing = bound - kept_bound.keys()
    assert len(missing) <= may_drop, project.failed(
        "otel-collector", f"{len(missing)} of 100 hog /io traces dropped, of which {may_drop} may be (waited too little)")
    by_figures = {t for t in bound - missing if gil_bound(kept_bound[t])}
    assert len(bound) - len(by_figures) <= may_drop, "hog /io traces kept without a GIL-bound figure, beyond those that waited too little"
    assert kept_calm.keys() <= calm, "a calm trace that the test did not send"
    by_policy = {t for t, spans in kept_calm.items() if gil_bound(spans)}  # calm, yet waited (a busy machine)
    sampled = len(kept_calm) - len(by_policy)
    low, high = binomial_bounds(len(calm) - len(by_policy), SAMPLE_PERCENT / 100)
    print(f"tail sampling: {len(by_figures)}/{len(bound)} hog /io traces kept as GIL-bound ({may_drop} waited at most "
          f"half their time, by the app's histogram); of {len(calm)} calm ones "
          f"{len(by_policy)} kept as GIL-bound and {sampled} of {len(calm) - len(by_policy)} sampled "
          f"(bounds {low}..{high} at {SAMPLE_PERCENT} %)")
    assert low <= sampled <= high, (sampled, low, high)


def test_prometheus_has_the_gil_series_and_evaluates_the_rules(project):
    """The apps' metrics arrive over OTLP (every 15 s) and the rules of examples/alerts run on
    them (every 30 s): GilContention's own expression has a value for each hog app."""
    base = project.url("prometheus")
    jobs = {name for name, _ in HOGS.values()}

    def jobs_of(query: str) -> set[str]:
        return {r["metric"]["job"] for r in stack.prometheus_api("query", base=base, query=query)["result"]}

    deadline = time.monotonic() + 120
    while True:
        series, ratios = jobs_of("gil_wait_time_seconds_total"), jobs_of("process:gil_wait_ratio:rate5m")
        if jobs <= series and jobs <= ratios or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert jobs <= series, project.failed("prometheus", f"gil_wait_time_seconds_total has jobs {series}, not {jobs}")
    assert jobs <= ratios, project.failed("prometheus", f"process:gil_wait_ratio:rate5m has jobs {ratios}, not {jobs}")
    rules = {r["name"]: r for g in stack.prometheus_api("rules", base=base)["groups"] for r in g["rules"]}
    contention = rules["GilContention"]
    assert contention["health"] == "ok" and contention["lastEvaluation"] > "2000", contention


def test_spans_fall_back_to_in_process_figures_when_the_collector_stops(project):
    """With gil-collector stopped, new requests of the hog app still get figures (in-process) and
    are kept as GIL-bound."""
    project.compose("stop", "gil-collector")
    time.sleep(2)  # the apps see the collector hang up
    since = now_us()
    calm_io = CalmIo(project, "flask-app")
    ids = send(project, "flask-app", 20, 4)
    may_drop = calm_io.spans(len(ids))
    found = wait_for_traces(project, HOGS["flask-app"][0], ids, since, may_drop)
    statuses = [server_span(found[t], "flask-app")["tags"].get("gil.status") for t in ids & found.keys()]
    assert len(ids - found.keys()) <= may_drop, \
        (f"{len(ids - found.keys())} of 20 traces not kept (without figures they are calm to "
         f"the sampler); those kept say gil.status {statuses}")
    assert not any(statuses), statuses


def test_compose_down_leaves_nothing_behind(project):
    """make compose-down: no container, network or volume of the project, and no API service it started."""
    done = subprocess.run(["make", "-C", str(ROOT), "compose-down"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OTEL_GIL_COMPOSE_PROJECT": PROJECT})
    assert done.returncode == 0, done.stdout + done.stderr
    engine = project.engine["engine"]
    left = {kind: [n for n in subprocess.run([engine, kind, "ls", "--all", "--format", "{{.Names}}"] if kind == "container"
                                             else [engine, kind, "ls", "--format", "{{.Name}}"],
                                             capture_output=True, text=True, check=True).stdout.split()
                   if n.startswith(f"{PROJECT}_")] for kind in ("container", "network", "volume")}
    assert not any(left.values()), left
    if engine == "podman":
        assert not os.path.exists(project.engine["docker_host"].removeprefix("unix://")), "the API service still serves"

"""make compose: docker-compose.yml's whole stack in a real container engine (Docker where its
daemon answers, else podman serving the Docker API: scripts/engine.sh), its base images pulled or
built here (scripts/images.sh), the load service driving both apps; then the slowest server spans
of each app as Jaeger has them, like make demo. The stack stays up; make compose-down removes
its containers, networks and volumes, and stops the API service engine.sh started.

make compose-scale: the same stack at scale (docker-compose.scale.yml): requests that cross two
services, a loadbalancing tier over several tail samplers; then the slowest cross-service traces,
each service's server span with its GIL figures.

    make compose          (as root: python3 scripts/compose.py up)
    make compose-scale    (as root: python3 scripts/compose.py up --scale)
    make compose-down     (as root: python3 scripts/compose.py down)

The tests start the same stack (``Stack``) under another project name and other host ports.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
import demo  # noqa: E402  (scripts/demo.py: its table of spans)
import stack  # noqa: E402  (examples/stack.py: Jaeger's API)

COMPOSE_FILE = ROOT / "docker-compose.yml"
SCALE_FILE = ROOT / "docker-compose.scale.yml"  # given after COMPOSE_FILE
# The host port of each published service, as docker-compose.yml has it by default; the file
# reads service S's from $OTEL_GIL_<S>_PORT (port_variable).
PORTS = {"jaeger": 16686, "prometheus": 9090, "flask-app": 8000, "django-app": 8001, "async-app": 8002}
READY = {"jaeger": "/api/services", "prometheus": "/-/ready"}  # where a service says it is up; an app: /health
# The apps: compose service -> (its OTEL_SERVICE_NAME, the name of its /io server spans).
APPS = {"flask-app": ("flask-gil", "GET /io"), "django-app": ("django-gil", "GET io"),  # Django's follow its URL patterns
        "async-app": ("fastapi-gil", "GET /io")}
LOG_LINES = 30  # of a failed service's log, in errors
# make compose-scale: its published services, the services it starts and the replicas of some.
SCALE_PORTS = {"jaeger": 16686, "prometheus": 9090, "async-app": 8002, "async-calm": 8003}
SCALE_SERVICES = ("gil-collector", "otel-collector", "otel-sampler", "jaeger", "prometheus", "async-app", "async-calm",
                  "flask-backend", "flask-backend-calm", "chain-load")
SCALE_REPLICAS = {"otel-sampler": 2, "flask-backend": 2}
FRONTENDS = {"async-app": "fastapi-gil", "async-calm": "fastapi-gil-calm"}  # whose /chain/NAME calls another service


class StackError(RuntimeError):
    """A service did not come up or misbehaved; the message names it and ends with its log."""


@dataclass
class Stack:
    """One compose project of docker-compose.yml (plus ``files``), on ``ports`` of the host."""

    name: str = "otel-gil"
    files: tuple[Path, ...] = (COMPOSE_FILE,)
    ports: dict[str, int] = field(default_factory=lambda: dict(PORTS))
    sample_percent: float = 100
    replicas: dict[str, int] = field(default_factory=dict)  # service -> how many containers up starts (default 1)
    engine: dict[str, str] = field(default_factory=dict)  # scripts/engine.sh up's answer

    def url(self, service: str) -> str:
        return f"http://127.0.0.1:{self.ports[service]}"

    def environment(self) -> dict[str, str]:
        env = {**os.environ, "OTEL_GIL_SAMPLE_PERCENT": str(self.sample_percent)}
        env.update({port_variable(service): str(port) for service, port in self.ports.items()})
        if self.engine.get("docker_host"):
            env["DOCKER_HOST"] = self.engine["docker_host"]
        return env

    def compose(self, *args: str, check: bool = True, timeout: float = 1800) -> str:
        """Run Compose on this project; its output (stdout and stderr), which a failure raises."""
        argv = [*self.engine["compose"].split(), "-p", self.name, *(f"--file={f}" for f in self.files), *args]
        done = subprocess.run(argv, cwd=ROOT, env=self.environment(), capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            command = f"{self.engine['compose']} -p {self.name} {' '.join(args)}"
            raise StackError(f"{command} failed:\n{done.stdout}{done.stderr}")
        return done.stdout + done.stderr

    def logs(self, service: str, lines: int = LOG_LINES) -> str:
        return self.compose("logs", "--no-color", f"--tail={lines}", service, check=False)

    def why_no_ui(self) -> str:
        """Why the jaeger service has no UI, as its log's first line says (images/jaeger/entrypoint.sh)."""
        said = [line for line in self.logs("jaeger", lines=1000).splitlines() if "no UI: " in line]
        return said[0].split("no UI: ", 1)[1] if said else "its log does not say why"

    def failed(self, service: str, what: str) -> StackError:
        return StackError(f"compose service {service}: {what}; its last log lines:\n{self.logs(service)}")

    def container_pid(self, service: str) -> int:
        """The host pid of the service's (first) container's main process."""
        container = self.compose("ps", "-q", service).split()[0]
        done = subprocess.run([self.engine["engine"], "inspect", "--format", "{{.State.Pid}}", container],
                              capture_output=True, text=True, check=True, env=self.environment())
        return int(done.stdout)

    def up(self, services: tuple[str, ...] = ()) -> None:
        """Engine, images, then ``services`` (default: all) built, started and answering."""
        self.engine = engine("up")
        run([str(ROOT / "scripts" / "images.sh"), self.engine["engine"]], "the base images")
        self.compose("build", *services)
        scale = [f"--scale={service}={count}" for service, count in self.replicas.items()]
        self.compose("up", "-d", "--no-build", *scale, *services)
        self.wait_log("gil-collector", "listening on ")
        for service in self.ports:  # each published service answers (the apps on /health)
            if not services or service in services:
                self.wait_http(service, self.url(service) + READY.get(service, "/health"))

    def wait_log(self, service: str, text: str, timeout: float = 120) -> None:
        """Until the service's log has ``text``, else its log."""
        deadline = time.monotonic() + timeout
        while text not in self.logs(service, lines=1000):
            if time.monotonic() > deadline:
                raise self.failed(service, f"its log did not say {text!r} within {timeout:.0f} s")
            time.sleep(1)

    def wait_http(self, service: str, url: str, timeout: float = 120) -> None:
        """Until ``url`` answers 200 (the service's container started the app), else its log."""
        deadline = time.monotonic() + timeout
        while not stack.http_ok(url):
            if time.monotonic() > deadline:
                raise self.failed(service, f"{url} did not answer within {timeout:.0f} s")
            time.sleep(1)

    def down(self) -> None:
        """Containers, networks and volumes of the project; then the API service engine.sh started."""
        self.engine = engine("up")  # (again: make compose-down may have stopped it)
        self.compose("down", "--volumes", "--remove-orphans", "--timeout=10")
        engine("down")


def port_variable(service: str) -> str:
    """The variable that sets a service's host port in the compose files: flask-app -> OTEL_GIL_FLASK_APP_PORT."""
    return f"OTEL_GIL_{service.upper().replace('-', '_')}_PORT"


def run(argv: list[str], what: str) -> str:
    done = subprocess.run(argv, stdout=subprocess.PIPE, text=True)  # progress goes to stderr, as it comes
    if done.returncode != 0:
        raise StackError(f"{what}: {' '.join(argv)} failed (see above)")
    return done.stdout


def engine(command: str) -> dict[str, str]:
    """scripts/engine.sh's answer: engine, docker_host, compose."""
    out = run([str(ROOT / "scripts" / "engine.sh"), command], "the container engine")
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def report(project: Stack, requests: int = 30) -> str:
    """Each app's slowest server spans, once Jaeger has ``requests`` of its GET /io spans."""
    jaeger = project.url("jaeger")
    out = []
    for service, (name, operation) in APPS.items():
        spans = [s for s in stack.wait_for_spans(name, operation, requests, timeout=180, base=jaeger)
                 if s["tags"].get("span.kind") == "server"]
        measured = [s for s in spans if "gil.wait_ms" in s["tags"]]  # a worker's first spans say gil.status=pending
        if not measured:
            raise project.failed(service, f"no server span of {name} with GIL figures reached Jaeger within 180 s")
        slowest = max(measured, key=lambda s: s["duration"])
        out += [f"\n{name} ({service}): slowest of {len(measured)} server spans with GIL figures, from Jaeger "
                f"({jaeger}/api/traces?service={name}):\n",
                (demo.async_table if name == "fastapi-gil" else demo.table)(measured, 5), "",
                demo.waits(slowest), "\n" + demo.trace_link(slowest["traceID"], project.why_no_ui, jaeger)]
    return "\n".join(out)


def server_spans(spans: list[dict]) -> list[dict]:
    """The server spans with GIL figures, in the order they started."""
    return sorted((s for s in spans if s["tags"].get("span.kind") == "server" and "gil.wait_ms" in s["tags"]),
                  key=lambda s: s["startTime"])


def chain_table(spans: list[dict]) -> str:
    """One cross-service trace: each service's server span with its GIL figures, in the order they started."""
    lines = [f"{'service':<18} {'span':<22} {'duration':>9} {'GIL wait':>9} {'GIL hold':>9} {'wait %':>7}  "
             "held the GIL meanwhile"]
    for s in server_spans(spans):
        t = s["tags"]
        service = s["process"].get("serviceName", "?")
        lines.append(f"{service:<18} {s['operationName']:<22} {s['duration'] / 1e3:>7.1f}ms "
                     f"{t['gil.wait_ms']:>7.1f}ms {t['gil.hold_ms']:>7.1f}ms {100 * t['gil.wait_ratio']:>6.1f}%  "
                     f"{demo.blockers(s)}")
    return "\n".join(lines)


def cross_service_traces(project: Stack) -> dict[str, list[dict]]:
    """Jaeger's traces of the frontends that hold server spans with GIL figures of two services or more."""
    found: dict[str, dict[str, dict]] = {}  # trace id -> span id -> span (a trace found under both frontends once)
    for name in FRONTENDS.values():
        for span in stack.jaeger_spans(name, limit=500, base=project.url("jaeger")):
            found.setdefault(span["traceID"], {})[span["spanID"]] = span
    traces = {trace_id: list(spans.values()) for trace_id, spans in found.items()}
    return {trace_id: spans for trace_id, spans in traces.items()
            if len({s["process"].get("serviceName") for s in server_spans(spans)}) >= 2}


def chain_report(project: Stack, traces: int = 3, wanted: int = 30, timeout: float = 180) -> str:
    """The slowest cross-service traces, once Jaeger has ``wanted`` of them: which hop waited on its GIL."""
    deadline = time.monotonic() + timeout
    while len(chains := cross_service_traces(project)) < wanted and time.monotonic() < deadline:
        time.sleep(2)
    if not chains:
        raise project.failed("otel-collector", f"no cross-service trace reached Jaeger within {timeout:.0f} s")
    out = [f"\nthe slowest {traces} of {len(chains)} cross-service traces in Jaeger "
           f"({project.url('jaeger')}/api/traces?service={FRONTENDS['async-calm']}):"]
    for trace_id, spans in sorted(chains.items(), key=lambda item: -max(s["duration"] for s in item[1]))[:traces]:
        out += ["", chain_table(spans), demo.trace_link(trace_id, project.why_no_ui, project.url("jaeger"))]
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("up", "down"))
    parser.add_argument("--scale", action="store_true", help="the stack at scale (docker-compose.scale.yml)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("compose: the container engine and the privileged collector need root: make compose (it uses sudo)")
    ports = SCALE_PORTS if args.scale else PORTS
    project = Stack(name=os.environ.get("OTEL_GIL_COMPOSE_PROJECT", "otel-gil"),
                    files=(COMPOSE_FILE, SCALE_FILE) if args.scale or args.command == "down" else (COMPOSE_FILE,),
                    ports={service: int(os.environ.get(port_variable(service), port))
                           for service, port in ports.items()},
                    sample_percent=float(os.environ.get("OTEL_GIL_SAMPLE_PERCENT", 5 if args.scale else 100)),
                    replicas=SCALE_REPLICAS if args.scale else {})
    try:
        if args.command == "down":
            project.down()
            print(f"compose: project {project.name} removed (containers, networks, volumes); images are kept")
            return 0
        start = time.monotonic()
        print("compose: engine, base images, the stack's images (the first run builds them: see README)...", flush=True)
        project.up(SCALE_SERVICES if args.scale else ())
        print(f"compose: up in {time.monotonic() - start:.0f} s on {project.engine['engine']}; "
              f"the load service drives {'the cross-service requests' if args.scale else 'both apps'}...", flush=True)
        print(chain_report(project) if args.scale else report(project))
    except StackError as exc:
        print(f"compose: {exc}", file=sys.stderr)
        return 1
    print(f"\nJaeger {project.url('jaeger')}, Prometheus {project.url('prometheus')}/alerts; the stack stays up: "
          "make compose-down removes it")
    return 0


if __name__ == "__main__":
    sys.exit(main())

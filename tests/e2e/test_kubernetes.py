"""The OpenTelemetry Operator's path, as Pods (scripts/kube.py, podman kube play): apps whose
images have no OpenTelemetry of their own (examples/kube/Dockerfile) get otel-gil from
otel-gil/autoinstrumentation-python's init container, and their spans reach Jaeger with GIL
figures, on two CPython versions; a Pod given the wrong tree (musl's, on glibc) serves all the
same and says why it has none. Pods played once for this module; every Pod, container and
volume they made is gone after it, also when a test failed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import yaml

from helpers import KNOWN_WAITS, check_known_waits, known_wait_ms, stack

import kube  # scripts/kube.py

REQUESTS = 20
PODS = [kube.AppPod(f"kube-test-{app}-{python.replace('.', '')}", app, python, port)
        for port, (app, python) in enumerate([(a, p) for p in ("3.11", "3.13") for a in kube.APPS], start=18400)]
MISMATCH = kube.AppPod("kube-test-flask-musl-tree", "flask", "3.11", 18420, platform="musl")


@pytest.fixture(scope="module")
def pods(jaeger, tmp_path_factory):
    if os.geteuid() != 0:
        pytest.fail("podman kube play needs root here: run as root, as CI does")
    workdir = tmp_path_factory.mktemp("kube")
    played = None
    try:
        kube.build_images()
        played = kube.play([*PODS, MISMATCH], workdir)
        kube.wait_ready([*PODS, MISMATCH])
        yield played
    except kube.KubeError as exc:
        pytest.fail(str(exc))
    finally:
        if played:
            kube.down(played)


def requests(pod: kube.AppPod) -> int:
    """REQUESTS GETs of the Pod's /io, all answered 200 (else the failure, with the Pod's log): since when (µs)."""
    since = time.time_ns() // 1000
    statuses = [kube.get(pod.url + "/io") for _ in range(REQUESTS)]
    assert statuses == [200] * REQUESTS, kube.failed(pod, f"/io answered {statuses}")
    return since


def server_spans(pod: kube.AppPod, since_us: int) -> list[dict]:
    spans = stack.wait_for_spans(pod.service, pod.span_name, REQUESTS, timeout=60, since_us=since_us)
    found = [s for s in spans if s["operationName"] == pod.span_name and s["tags"].get("span.kind") == "server"]
    assert len(found) >= REQUESTS, kube.failed(pod, f"{len(found)} of its {REQUESTS} server spans reached Jaeger")
    return found


def known_waits(pod: kube.AppPod) -> tuple[list[dict], list[float]]:
    """KNOWN_WAITS GETs of /blocked (examples/workload.py): their server spans' tags and truths."""
    since, name = time.time_ns() // 1000, pod.span_name.removesuffix("io") + "blocked"
    truths = [known_wait_ms(kube.get_text(pod.url + "/blocked")) for _ in range(KNOWN_WAITS)]
    spans = [s["tags"] for s in stack.wait_for_spans(pod.service, name, KNOWN_WAITS, timeout=60, since_us=since)
             if s["operationName"] == name and s["tags"].get("span.kind") == "server"]
    assert len(spans) == KNOWN_WAITS, kube.failed(pod, f"{len(spans)} of its {KNOWN_WAITS} {name} spans reached Jaeger")
    return spans, truths


@pytest.mark.parametrize("pod", PODS, ids=[p.name for p in PODS])
def test_operator_injected_app_spans_carry_gil_figures(pods, pod):
    """Each server span has the in-process figures (no collector in this path): wait and hold
    within the span's own time (1 ms for rounding); /blocked spans wait out the known hold (their
    median, 5 % or 0.5 ms: helpers.check_known_waits) and name its thread; no export failed (the Jaeger endpoint takes traces only: the
    Pods export no metrics or logs, as instrumentation.yaml says for it)."""
    spans = server_spans(pod, requests(pod))
    for span in spans:
        tags = span["tags"]
        assert "gil.status" not in tags and "gil.wait_ms" in tags, kube.failed(pod, f"a span without figures: {tags}")
        assert tags["gil.wait_ms"] + tags["gil.hold_ms"] <= span["duration"] / 1000 + 1, (span["duration"], tags)
    check_known_waits(*known_waits(pod))
    log = kube.logs(pod.name, lines=2000)
    assert "Failed to export" not in log, kube.failed(pod, "an export failed")


def test_mismatched_tree_serves_and_says_why(pods):
    """The musl tree on a glibc Python (the wrong otel-python-platform annotation): no otel-gil C
    part that this interpreter can load. The app answers every request, its spans reach Jaeger,
    each says gil.status=unsupported_interpreter, and its log says why in one line."""
    spans = server_spans(MISMATCH, requests(MISMATCH))
    statuses = {s["tags"].get("gil.status") for s in spans}
    assert statuses == {"unsupported_interpreter"}, statuses
    assert not any("gil.wait_ms" in s["tags"] for s in spans)
    said = [line for line in kube.logs(MISMATCH.name, lines=500).splitlines() if "otel_gil._inprocess was not built" in line]
    assert said, kube.failed(MISMATCH, "its log does not say why it has no figures")


def daemonset_capabilities() -> list[str]:
    return kube.daemonset_manifest()["spec"]["template"]["spec"]["containers"][0][
        "securityContext"]["capabilities"]["add"]


def wait_log(pod: str, container: str, done, timeout: float = 180) -> str:
    """The container's log once ``done(log)``, or at ``timeout``."""
    deadline = time.monotonic() + timeout
    while not done(log := kube.logs(pod, container, lines=200)) and time.monotonic() < deadline:
        time.sleep(1)
    return log


def test_collector_pod_with_least_privilege_and_with_one_capability_less(pods, tmp_path):
    """deploy/kubernetes/collector-daemonset.yaml's Pod template, played as a Pod: with its
    capabilities (no privileged) it loads its BPF program and serves; with any one of them
    dropped it says which in one line and exits non-zero, and an app Pod on its socket
    directory measures in-process. (Tracing the app Pods from it needs hostPID, which podman
    4.3's kube play ignores: the collector then sees their pids as 0.)"""
    caps = daemonset_capabilities()
    variants = {"all": caps, **{f"no-{c.lower().replace('_', '-')}": [k for k in caps if k != c] for c in caps}}
    sockets = {name: tmp_path / name for name in variants}
    for directory in sockets.values():
        directory.mkdir()
    collectors = [kube.collector_pod(f"kube-test-collector-{name}", str(sockets[name]), add)
                  for name, add in variants.items()]
    app = kube.AppPod("kube-test-flask-beside-collector", "flask", "3.11", 18430, socket_dir=str(sockets["no-sys-admin"]))
    played = kube.play(collectors, tmp_path, "collectors")
    app_played = None
    try:
        for name in variants:
            pod = f"kube-test-collector-{name}"
            log = wait_log(pod, "collector", lambda text: any(end in text for end in ("listening on", "otel-gil-collector: ",
                                                                                  "otel-gil-collector lacks")))
            if name == "all":
                assert "listening on /run/otel-gil/otel-gil.sock" in log, log
                continue
            lacking = f"CAP_{name.removeprefix('no-').upper().replace('-', '_')}"
            said = [line for line in log.splitlines() if "lacks" in line]
            assert len(said) == 1 and said[0].startswith(f"otel-gil-collector lacks {lacking}") and said[0].endswith(
                ": add it to its capabilities (Kubernetes: securityContext.capabilities.add, as "
                "deploy/kubernetes/collector-daemonset.yaml does), or run it as root with all of them"), log
            assert kube.exit_code(f"{pod}-collector") != 0
        app_played = kube.play([app], tmp_path, "app")
        kube.wait_ready([app])
        spans = server_spans(app, requests(app))
        assert all("gil.status" not in s["tags"] and "gil.wait_ms" in s["tags"] for s in spans), \
            [s["tags"].get("gil.status") for s in spans]
    finally:
        for path in (app_played, played):
            if path:
                kube.down(path)


# A thread holds the GIL for HOLD_MS through PyDLL (ground truth) while the span's thread asks for it.
HOLD_MS = 200
TRACED_APP = """
import ctypes, json, sys, threading, time
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otel_gil import GilInstrumentor
spans = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(spans))
GilInstrumentor().instrument(tracer_provider=provider)
tracer = provider.get_tracer("kube-test")
with tracer.start_as_current_span("registered"):
    time.sleep(0.5)
hog = threading.Thread(target=ctypes.PyDLL(None).usleep, args=(int(sys.argv[1]) * 1000,), name="gil-hog")
with tracer.start_as_current_span("victim"):
    hog.start()
    time.sleep(0.02)  # the hog holds the GIL from here
    hog.join()
print(json.dumps({s.name: dict(s.attributes) for s in spans.get_finished_spans()}))
"""


def test_collector_container_with_the_daemonsets_capabilities_traces_an_app(tmp_path):
    """The DaemonSet's container with its securityContext (its capabilities only, seccomp as it
    says, no privilege escalation) in the host's pid namespace (podman run --pid=host: podman
    4.3's kube play ignores hostPID) traces an app outside it: the app's span waited out the
    hog's PyDLL hold (the hog's hold within 5 %; the victim's wait too, or up to the 20 ms it
    may sleep first)."""
    container = kube.daemonset_manifest()["spec"]["template"]["spec"]["containers"][0]
    security = container["securityContext"]
    assert security["privileged"] is False and security["capabilities"]["drop"] == ["ALL"], security
    pod, sockets = "kube-test-hostpid", tmp_path / "socket"
    name = f"{pod}-collector"  # as kube.logs names a Pod's container
    sockets.mkdir()
    argv = [kube.ENGINE, "run", "-d", "--rm", "--name", name, "--pid=host", "--cap-drop=ALL",
            *(f"--cap-add={c}" for c in security["capabilities"]["add"]),
            "--security-opt", f"seccomp={security['seccompProfile']['type'].lower()}",
            "--security-opt", "no-new-privileges", "-v", "/lib/modules:/lib/modules:ro", "-v", "/usr/src:/usr/src:ro",
            "-v", f"{sockets}:/run/otel-gil", kube.COLLECTOR_IMAGE, *container["args"]]
    subprocess.run([kube.ENGINE, "rm", "-f", "-t0", name], capture_output=True)
    try:
        kube.build_images()
        kube.run(*argv)
        log = wait_log(pod, "collector", lambda text: any(end in text for end in ("listening on", "lacks", "failed")))
        assert "listening on /run/otel-gil/otel-gil.sock" in log, log
        env = {**os.environ, "OTEL_GIL_BACKEND": "collector", "OTEL_GIL_SOCKET": str(sockets / "otel-gil.sock"),
               "PYTHONPATH": str(kube.ROOT)}
        done = subprocess.run([sys.executable, "-c", TRACED_APP, str(HOLD_MS)], capture_output=True, text=True,
                              timeout=120, env=env)
        assert done.returncode == 0, done.stderr
        victim = json.loads(done.stdout.splitlines()[-1])["victim"]
        assert "gil.status" not in victim, (victim, kube.run(kube.ENGINE, "logs", name, check=False))
        assert abs(victim["gil.top_blocker.hold_ms"] - HOLD_MS) <= 0.05 * HOLD_MS, victim
        assert HOLD_MS - 20 - 0.05 * HOLD_MS <= victim["gil.wait_ms"] <= HOLD_MS + 0.05 * HOLD_MS, victim
        assert victim["gil.top_blocker.thread.name"] == "gil-hog", victim
    finally:
        subprocess.run([kube.ENGINE, "rm", "-f", "-t0", name], capture_output=True)


def test_local_debian_base_runs_a_pods_command_by_name(tmp_path):
    """A Pod's ``command: [cp, ...]`` in debian:bookworm-slim as scripts/images.sh builds it (the
    Operator's init containers run cp so): found on the official image's PATH. Before the
    image had one, podman kube play failed with 'exec: "cp": executable file not found in $PATH'."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "kube-test-debian-path"},
           "spec": {"restartPolicy": "Never", "containers": [
               {"name": "cp", "image": "docker.io/library/debian:bookworm-slim", "imagePullPolicy": "Never",
                "command": ["cp", "/etc/debian_version", "/tmp/"]}]}}
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(pod))
    try:
        played = subprocess.run(["podman", "kube", "play", str(path)], capture_output=True, text=True, timeout=120)
        assert played.returncode == 0, played.stderr
        assert kube.exit_code("kube-test-debian-path-cp") == 0, kube.logs("kube-test-debian-path", "cp")
    finally:
        kube.down(path)


def test_kube_down_leaves_nothing(pods):
    """podman kube down: no Pod, container or volume (the emptyDirs) of the module's Pods is left."""
    kube.down(pods)
    names = [p.name for p in (*PODS, MISMATCH)]
    left = {kind: [n for n in subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()
                   if any(n.startswith(name) for name in names)]
            for kind, argv in {"pod": ["podman", "pod", "ps", "--format", "{{.Name}}"],
                               "container": ["podman", "ps", "--all", "--format", "{{.Names}}"],
                               "volume": ["podman", "volume", "ls", "--format", "{{.Name}}"]}.items()}
    assert not any(left.values()), left

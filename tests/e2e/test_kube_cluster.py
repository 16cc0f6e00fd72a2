"""A real single-node Kubernetes here (scripts/kube_cluster.py: etcd, kube-apiserver,
-controller-manager, -scheduler, a kubelet on containerd with runc and CNI): a Deployment's Pod
runs on the node with an address on the Pods' bridge; the OpenTelemetry Operator
(scripts/kube_operator.py, its own CRDs, RBAC and webhooks) mutates a plain Deployment's Pod
annotated as the README says; the example apps as plain Deployments so annotated, in a namespace
enforcing PodSecurity restricted, serve from the Pods the controllers and the webhook make, export
to Jaeger in the cluster and wait out a known hold; on a free-threaded CPython the app keeps its
GIL off and its spans park for the known time, on 3.9 it serves uninstrumented and says why, on
musl it serves and its spans say why they carry no figures; and down leaves no process, mount,
veth, bridge, cgroup or iptables chain behind. Started once for the module, down at its end also
when a test failed."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import KNOWN_WAITS, ROOT, check_known_waits, known_wait_ms, within

sys.path.insert(0, str(ROOT / "scripts"))
import kube  # noqa: E402
import kube_cluster as cluster  # noqa: E402
import kube_operator as operator  # noqa: E402
import manifests  # noqa: E402

APPS_NAMESPACE = "otel-gil-apps"
PYTHON_IMAGE = kube.OPERATOR_IMAGE  # make operator-image's
JAEGER_IMAGE = "docker.io/jaegertracing/jaeger:2.13.0"  # scripts/images.sh's
# The example apps as plain Deployments of images with no OpenTelemetry (examples/kube/Dockerfile):
# each framework once, on two CPythons.
APPS = [("flask", "3.11"), ("fastapi", "3.13"), ("django", "3.13")]
# Flask on CPythons the tree has no GIL figures for (kube.EDGE_BASES): free-threaded, older than its
# SDK, on musl (its Pod template annotated for the Operator's musl tree).
FREE_THREADED, OLDER, MUSL = EDGE = [("flask", python) for python in kube.EDGE_BASES]
MUSL_PLATFORM = {"instrumentation.opentelemetry.io/otel-python-platform": "musl"}
APP_PORT = 8000  # in each Pod's own network namespace
RESTRICTED = {"runAsNonRoot": True, "runAsUser": 10001, "allowPrivilegeEscalation": False,
              "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}
TREE_LIMIT = 200 * 2**20  # the Operator's default sizeLimit of the tree's emptyDir (200Mi)


def veths(*selector: str) -> set[str]:
    """The names of the host's veths (``selector``: e.g. master BRIDGE)."""
    return {line.split(":")[1].strip().split("@")[0]
            for line in subprocess.run(["ip", "-o", "link", "show", *selector, "type", "veth"], capture_output=True,
                                       text=True, check=True).stdout.splitlines()}


@pytest.fixture(scope="module")
def node():
    if os.geteuid() != 0:
        pytest.fail("containerd, the kubelet and their mounts need root: run as root, as CI does")
    if (cluster.RUN / "pids").exists():
        pytest.fail(f"a cluster of scripts/kube_cluster.py runs already ({cluster.RUN}): make kube-cluster-down first")
    var_lib_kubelet = cluster.KUBELET_FIXED.exists()
    try:
        started = time.monotonic()
        cluster.up()
        up_s = time.monotonic() - started
        yield {"up_s": up_s, "var_lib_kubelet": var_lib_kubelet}
    except cluster.ClusterError as exc:
        pytest.fail(str(exc))
    finally:
        cluster.down()


def kubectl_json(*args: str) -> dict:
    return json.loads(cluster.kubectl(*args, "-o", "json"))


def wait_for(what: str, done, timeout: float = 120, seen=None):
    """``done()``'s first true answer, polled each second; a failure after ``timeout`` s says
    what ``seen()`` (logs, where given) shows then."""
    deadline = time.monotonic() + timeout
    while not (result := done()):
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {timeout:.0f} s" + (f"\n{seen()}" if seen is not None else ""))
        time.sleep(1)
    return result


def deployment(name: str, namespace: str, annotations: dict | None = None) -> dict:
    """A plain Deployment of the sandbox image (the one image a node has without the engine)."""
    labels = {"app": name}
    container = {"name": "app", "image": cluster.PAUSE_IMAGE, "imagePullPolicy": "Never", "securityContext": RESTRICTED}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
                "metadata": {"labels": labels, "annotations": annotations or {}},
                "spec": {"containers": [container]}}}}


def apply(*objects: dict) -> None:
    cluster.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)}).encode())


def pod_of(name: str, namespace: str) -> dict:
    pods = kubectl_json("-n", namespace, "get", "pods", "-l", f"app={name}")["items"]
    return pods[0] if pods else {}


def test_deployment_runs_on_the_node(node):
    """The controllers make the Pod, the scheduler binds it, the kubelet runs it through
    containerd and runc, CNI gives it an address in the Pods' range."""
    apply(deployment("sandbox", "default"))
    pod = wait_for("the Deployment's Pod running", lambda: (p := pod_of("sandbox", "default")) and
                   p["status"].get("phase") == "Running" and p)
    assert pod["spec"]["nodeName"] == cluster.NODE
    assert pod["status"]["podIP"].startswith(cluster.GATEWAY.rsplit(".", 1)[0] + "."), pod["status"]
    print(f"cluster up in {node['up_s']:.0f} s")


@pytest.fixture(scope="module")
def instrumented_namespace(node):
    """The Operator, and the chart's Instrumentation in a namespace that enforces PodSecurity restricted."""
    instrument(APPS_NAMESPACE, "restricted")
    return APPS_NAMESPACE


def instrument(namespace: str, level: str, *values: str) -> None:
    """The Operator, and the chart's Instrumentation (helm ``values`` too) in ``namespace``, which
    enforces PodSecurity ``level``."""
    try:
        operator.install()
    except cluster.ClusterError as exc:
        pytest.fail(str(exc))
    labels = {f"pod-security.kubernetes.io/{mode}": level for mode in ("enforce", "warn")}
    apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": labels}})
    helm_install("otel-gil", namespace, "collector.enabled=false", f"instrumentation.image={PYTHON_IMAGE}", *values)


def helm_install(release: str, namespace: str, *values: str) -> None:
    """The chart installed on the cluster, as the README says."""
    cluster.run(manifests.helm(), "install", release, str(manifests.CHART), "--kubeconfig", str(cluster.KUBECONFIG),
                "--namespace", namespace, *(a for v in values for a in ("--set", v)), timeout=120)


def test_operator_webhook_injects_a_plain_deployment(instrumented_namespace):
    """A plain Deployment annotated inject-python: "otel-gil" (the README's words): its Pod, as the
    controllers create it and the Operator's webhook changes it, has the tree's init container with
    the app container's restricted securityContext, the 200Mi emptyDir, the tree on PYTHONPATH and
    the Instrumentation's OTEL_GIL_BACKEND; the namespace's PodSecurity restricted admitted it."""
    apply(deployment("plain", instrumented_namespace,
                     {"instrumentation.opentelemetry.io/inject-python": "otel-gil"}))
    pod = wait_for("the Deployment's Pod", lambda: pod_of("plain", instrumented_namespace))
    spec = pod["spec"]
    init = [c for c in spec.get("initContainers", []) if c["name"] == "opentelemetry-auto-instrumentation-python"]
    assert init, f"no init container: the webhook did not inject (its failurePolicy is Ignore): {spec}"
    assert init[0]["image"] == PYTHON_IMAGE and init[0]["securityContext"] == spec["containers"][0]["securityContext"]
    volume = next(v for v in spec["volumes"] if v["name"] == "opentelemetry-auto-instrumentation-python")
    assert volume["emptyDir"]["sizeLimit"] == "200Mi"
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    assert env["PYTHONPATH"].startswith("/otel-auto-instrumentation-python/opentelemetry/instrumentation/")
    assert env["OTEL_GIL_BACKEND"] == "auto" and env["OTEL_SERVICE_NAME"] == "plain", env


def test_collector_chart_makes_a_daemonset_pod_on_the_node(node):
    """The chart's collector half, installed: its namespace (PodSecurity privileged) admits the
    DaemonSet's Pod (hostPID, hostPath, capabilities, system-node-critical), bound to the node.
    (The collector's image is not on the node here: what it does there is not checked.)"""
    helm_install("otel-gil-collector", "default", "instrumentation.enabled=false",
                 "collector.image=localhost/otel-gil/collector:absent", "collector.imagePullPolicy=Never")
    pods = wait_for("the DaemonSet's Pod bound to a node", lambda: (
        items := kubectl_json("-n", "otel-gil-system", "get", "pods")["items"]) and items[0]["spec"].get("nodeName")
        and items)
    spec = pods[0]["spec"]
    assert len(pods) == 1 and spec["nodeName"] == cluster.NODE and spec["hostPID"] is True, spec
    assert spec["priorityClassName"] == "system-node-critical" and spec["priority"] == 2000001000, spec


def app_name(app: str, python: str) -> str:
    return f"{app}-{python.replace('.', '')}"


def app_deployment(app: str, python: str) -> dict:
    """The example ``app`` as a team would deploy it: its own command, env and probe, restricted,
    its Pod template annotated as the README says."""
    venv, command, workdir, _ = kube.APPS[app]
    app_dir = f"/opt/otel-gil/examples/{workdir}"
    env = {"PATH": f"/opt/{venv}/bin:/usr/local/bin:/usr/bin:/bin", "PYTHONPATH": app_dir,
           "DJANGO_SETTINGS_MODULE": "gilsite.settings", "DJANGO_ALLOWED_HOSTS": "$(POD_IP)",  # probes, requests
           "OTEL_BSP_SCHEDULE_DELAY": "1000", **kube.HOG}
    manifest = deployment(app_name(app, python), APPS_NAMESPACE,
                          {"instrumentation.opentelemetry.io/inject-python": "otel-gil",
                           **(MUSL_PLATFORM if (app, python) == MUSL else {})})
    manifest["spec"]["template"]["spec"]["containers"][0].update(
        image=kube.app_image(python), workingDir=app_dir,
        command=[a.replace("127.0.0.1", "0.0.0.0") for a in (kube.musl_server if (app, python) == MUSL else command)(APP_PORT)],
        env=[{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
             *({"name": k, "value": v} for k, v in env.items())],
        readinessProbe={"httpGet": {"path": "/health", "port": APP_PORT}, "periodSeconds": 1})
    return manifest


@pytest.fixture(scope="module")
def apps(instrumented_namespace):
    """Jaeger in the cluster, the Instrumentation's endpoint its OTLP/HTTP receiver (helm upgrade),
    then the apps' Deployments rolled out: Jaeger's API base URL (the node reaches the Pods' range)."""
    started = time.monotonic()
    try:
        kube.build_operator_image()  # (on a fresh machine no test before this one built it)
        kube.build_app_images({**kube.APP_BASES, **kube.EDGE_BASES})
        for image in (JAEGER_IMAGE, PYTHON_IMAGE, *{kube.app_image(python) for _, python in APPS + EDGE}):
            cluster.load(image)
    except (cluster.ClusterError, kube.KubeError) as exc:
        pytest.fail(str(exc))
    loaded_s = time.monotonic() - started
    jaeger = deployment("jaeger", "default")
    jaeger["spec"]["template"]["spec"]["containers"][0].update(image=JAEGER_IMAGE)
    apply(jaeger)
    ip = wait_for("Jaeger's Pod running", lambda: (p := pod_of("jaeger", "default")) and
                  p["status"].get("phase") == "Running" and p["status"].get("podIP"))
    base = f"http://{ip}:16686"
    wait_for("Jaeger's API", lambda: kube.stack.http_ok(f"{base}/api/services"))
    cluster.run(manifests.helm(), "upgrade", "otel-gil", str(manifests.CHART), "--kubeconfig", str(cluster.KUBECONFIG),
                "--namespace", APPS_NAMESPACE, "--reuse-values", "--set", f"instrumentation.endpoint=http://{ip}:4318",
                "--set", "instrumentation.metricsExporter=none", "--set", "instrumentation.logsExporter=none",
                timeout=120)
    apply(*(app_deployment(app, python) for app, python in APPS + EDGE))
    for app, python in APPS + EDGE:
        name = app_name(app, python)
        try:
            cluster.kubectl("-n", APPS_NAMESPACE, "rollout", "status", f"deployment/{name}", "--timeout=180s",
                            timeout=200)
        except cluster.ClusterError as exc:
            pods = ("-n", APPS_NAMESPACE, "-l", f"app={name}")
            pytest.fail(f"{exc}\n{cluster.kubectl('describe', 'pods', *pods, check=False)}"
                        f"{cluster.kubectl('logs', '--all-containers', *pods, check=False)}")
    print(f"images on the node in {loaded_s:.0f} s, Jaeger and the apps ready {time.monotonic() - started:.0f} s after")
    return base


@pytest.mark.parametrize("app, python", APPS, ids=[app_name(a, p) for a, p in APPS])
def test_injected_deployment_spans_carry_figures_against_truth(apps, app, python):
    """The Pod the controllers and the webhook make of the plain Deployment (restricted) serves;
    its /blocked spans, read from Jaeger in the cluster, wait out gil-holder's known hold (their
    median, 5 % or 0.5 ms: helpers.check_known_waits) and name it, under the Pod's own namespace
    and name as the Operator's resource env says; no export failed; the tree it got fits the
    Operator's 200Mi emptyDir."""
    name = app_name(app, python)
    pod = pod_of(name, APPS_NAMESPACE)
    url, operation = f"http://{pod['status']['podIP']}:{APP_PORT}", kube.APPS[app][3].removesuffix("io") + "blocked"
    since = time.time_ns() // 1000
    truths = [known_wait_ms(kube.get_text(f"{url}/blocked")) for _ in range(KNOWN_WAITS)]
    spans = [s for s in kube.stack.wait_for_spans(name, operation, KNOWN_WAITS, timeout=60, since_us=since, base=apps)
             if s["operationName"] == operation and s["tags"].get("span.kind") == "server"]
    log = cluster.kubectl("-n", APPS_NAMESPACE, "logs", pod["metadata"]["name"], "-c", "app")
    assert len(spans) == KNOWN_WAITS, (spans, log)
    check_known_waits([s["tags"] for s in spans], truths)
    for span in spans:  # the resource the Operator's env gives: this Pod's
        resource = {t["key"]: t["value"] for t in span["process"]["tags"]}
        assert resource["k8s.namespace.name"] == APPS_NAMESPACE, resource
        assert resource["k8s.pod.name"] == pod["metadata"]["name"], resource
    assert "Failed to export" not in log, log
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == kube.VOLUME)
    size = int(cluster.kubectl("-n", APPS_NAMESPACE, "exec", pod["metadata"]["name"], "-c", "app", "--",
                               "du", "-sb", kube.MOUNT).split()[0])
    assert volume["emptyDir"]["sizeLimit"] == "200Mi" and size < TREE_LIMIT, (volume, size)
    print(f"{name}: /blocked waits {[s['tags']['gil.wait_ms'] for s in spans]} ms, holds {truths} ms; "
          f"tree {size / 2**20:.1f} MiB of the 200Mi emptyDir")


def test_free_threaded_app_keeps_its_gil_off_and_parks_for_the_known_hold(apps):
    """Flask on a free-threaded CPython (3.13t), its Deployment injected as the others: it serves
    (the tree's .abi3.so crashed it at start); its /blocked spans, read from Jaeger, say
    gil_disabled (read at each span start: the GIL still off), carry no GIL figure, and park in
    gil-holder's join for its hold (no GIL keeps the request out meanwhile: cpython.parked.other_ms,
    their median within 5 % or 0.5 ms of the holds'); the app with the tree, imported in the Pod,
    leaves the GIL off (no extension of the tree turns it on) and the app's log says no import did."""
    name = app_name(*FREE_THREADED)
    pod = pod_of(name, APPS_NAMESPACE)
    url, operation = f"http://{pod['status']['podIP']}:{APP_PORT}", "GET /blocked"
    since = time.time_ns() // 1000
    truths = [known_wait_ms(kube.get_text(f"{url}/blocked")) for _ in range(KNOWN_WAITS)]
    spans = [s for s in kube.stack.wait_for_spans(name, operation, KNOWN_WAITS, timeout=60, since_us=since, base=apps)
             if s["operationName"] == operation and s["tags"].get("span.kind") == "server"]
    in_app = ("-n", APPS_NAMESPACE, pod["metadata"]["name"], "-c", "app")
    log = cluster.kubectl("logs", *in_app)
    assert len(spans) == KNOWN_WAITS, log
    tags = [s["tags"] for s in spans]
    assert all(t.get("gil.status") == "gil_disabled" and not {"gil.wait_ms", "gil.hold_ms"} & t.keys() for t in tags), tags
    parked = [t["cpython.parked.other_ms"] for t in tags]
    assert within(statistics.median(parked), statistics.median(truths)), (parked, truths)
    gil = cluster.kubectl("exec", *in_app, "--", "python", "-c", "import app, sys; print(sys._is_gil_enabled())")
    assert gil.split() == ["False"], gil
    assert "GIL) has been enabled" not in log and "Failed to export" not in log, log
    print(f"{name}: /blocked parked {parked} ms in gil-holder's join, holds {truths} ms")


def test_app_older_than_the_tree_serves_uninstrumented(apps):
    """Flask on CPython 3.9 (the tree's SDK requires 3.10), injected as the others: it serves; the
    tree took itself off its path and said so in one line (its log), and no span of it reached
    Jaeger (none could say why), though its readiness probe asks /health every second, as the 3.11
    Flask app's does, whose spans did."""
    name, control = app_name(*OLDER), app_name(*APPS[0])
    pod = pod_of(name, APPS_NAMESPACE)
    assert [kube.get(f"http://{pod['status']['podIP']}:{APP_PORT}/health") for _ in range(3)] == [200] * 3
    since = time.time_ns() // 1000 - 2_000_000
    assert kube.stack.wait_for_spans(control, "GET /health", 1, timeout=60, since_us=since, base=apps)
    log = cluster.kubectl("-n", APPS_NAMESPACE, "logs", pod["metadata"]["name"], "-c", "app")
    said = "otel-gil: CPython 3.9 is older than the instrumentation tree's 3.10: not instrumented"
    assert log.count(said) == 1 and "Traceback" not in log, log
    services = json.loads(kube.get_text(f"{apps}/api/services"))["data"] or []
    assert name not in services and control in services, services


def test_musl_app_serves_and_its_spans_say_why_they_carry_no_figures(apps):
    """Flask on waitress on musl (scripts/musl-python.sh's CPython 3.13 on musl's libc alone:
    examples/kube/musl.Dockerfile), its Pod template annotated otel-python-platform: musl: the
    webhook copies the musl tree (otel-gil without its C parts) and the app, on musl's extension
    suffix, serves; its /blocked spans, read from Jaeger, say gil.status unsupported_interpreter
    (the C part was not built) and carry no GIL figure, and no export failed."""
    name = app_name(*MUSL)
    pod = pod_of(name, APPS_NAMESPACE)
    init = next(c for c in pod["spec"]["initContainers"] if c["name"] == kube.INIT_CONTAINER)
    assert any(kube.TREES["musl"].rstrip(".") in arg for arg in init["command"]), init
    url, operation = f"http://{pod['status']['podIP']}:{APP_PORT}", "GET /blocked"
    since = time.time_ns() // 1000
    answers = [kube.get_text(f"{url}/blocked") for _ in range(KNOWN_WAITS)]
    spans = [s for s in kube.stack.wait_for_spans(name, operation, KNOWN_WAITS, timeout=60, since_us=since, base=apps)
             if s["operationName"] == operation and s["tags"].get("span.kind") == "server"]
    in_app = ("-n", APPS_NAMESPACE, pod["metadata"]["name"], "-c", "app")
    log = cluster.kubectl("logs", *in_app)
    assert len(spans) == KNOWN_WAITS, (answers, log)
    tags = [s["tags"] for s in spans]
    assert all(t.get("gil.status") == "unsupported_interpreter" and not {"gil.wait_ms", "gil.hold_ms"} & t.keys()
               for t in tags), tags
    suffix = cluster.kubectl("exec", *in_app, "--", "python", "-c",
                             "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
    assert suffix.split() == [".cpython-313-x86_64-linux-musl.so"], suffix
    assert "Failed to export" not in log and "Traceback" not in log, log
    print(f"{name}: {len(spans)} /blocked spans say unsupported_interpreter; {answers[0].strip()}")


def test_down_leaves_nothing(node):
    """After down: no process it started, no mount under its directories, no bridge and none of
    the Pods' veths, no kubepods cgroup, no KUBE-* iptables chain and no rule naming its bridge or
    range, no directory it made (the kubelet's /var/lib/kubelet too), the kernel settings it
    changed restored."""
    pids = [int(p.read_text()) for p in (cluster.RUN / "pids").iterdir()]
    sysctls = json.loads((cluster.RUN / "sysctls.json").read_text())
    pods_veths = veths("master", cluster.BRIDGE)  # the host ends of the running Pods' interfaces
    cluster.down()
    assert {k: (Path("/proc/sys") / k).read_text() for k in sysctls} == sysctls
    assert not [pid for pid in pids if cluster.alive(pid)]
    assert not cluster.mounts_below(cluster.RUN, cluster.STATE, cluster.IMAGES)
    assert subprocess.run(["ip", "link", "show", cluster.BRIDGE], capture_output=True).returncode != 0
    assert pods_veths and not pods_veths & veths()
    assert not [h for h in os.listdir("/sys/fs/cgroup") if os.path.isdir(f"/sys/fs/cgroup/{h}/kubepods")]
    for tool in ("iptables", "ip6tables"):
        for table in ("filter", "nat", "mangle"):
            rules = cluster.run(tool, "-t", table, "-S")
            assert "KUBE-" not in rules and cluster.BRIDGE not in rules and cluster.POD_CIDR not in rules, (tool, table)
    assert not cluster.RUN.exists() and not cluster.STATE.exists()
    assert cluster.KUBELET_FIXED.exists() == node["var_lib_kubelet"]

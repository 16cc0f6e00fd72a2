"""A real single-node Kubernetes here (scripts/kube_cluster.py: etcd, kube-apiserver,
-controller-manager, -scheduler, a kubelet on containerd with runc and CNI): a Deployment's Pod
runs on the node with an address on the Pods' bridge; the OpenTelemetry Operator
(scripts/kube_operator.py, its own CRDs, RBAC and webhooks) mutates a plain Deployment's Pod
annotated as the README says; and down leaves no process, mount, veth, bridge, cgroup or
iptables chain behind. Started once for the module, down at its end also when a test failed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import kube_cluster as cluster  # noqa: E402
import kube_operator as operator  # noqa: E402
import manifests  # noqa: E402

APPS_NAMESPACE = "otel-gil-apps"
PYTHON_IMAGE = "localhost/otel-gil/autoinstrumentation-python:0.1.0"  # make operator-image's


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


def wait_for(what: str, done, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while not (result := done()):
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {timeout:.0f} s")
        time.sleep(1)
    return result


def deployment(name: str, namespace: str, annotations: dict | None = None) -> dict:
    """A plain Deployment of the sandbox image (the one image a node has without the engine)."""
    labels = {"app": name}
    container = {"name": "app", "image": cluster.PAUSE_IMAGE, "imagePullPolicy": "Never",
                 "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "allowPrivilegeEscalation": False,
                                     "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}}
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
    try:
        operator.install()
    except cluster.ClusterError as exc:
        pytest.fail(str(exc))
    labels = {f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "warn")}
    apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": APPS_NAMESPACE, "labels": labels}})
    helm_install("otel-gil", APPS_NAMESPACE, "collector.enabled=false", f"instrumentation.image={PYTHON_IMAGE}")
    return APPS_NAMESPACE


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

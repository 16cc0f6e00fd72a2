"""The Helm chart (deploy/helm/otel-gil) passes helm lint, renders the collector DaemonSet with
the fields an operator of production eBPF agents expects and a namespaced Instrumentation, and
deploy/kubernetes/'s plain manifests are its rendering (scripts/manifests.py), byte for byte."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from helpers import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import manifests  # noqa: E402  (scripts/manifests.py)


def documents(text: str) -> dict[str, dict]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(text) if doc}


@pytest.fixture(scope="module")
def rendered() -> dict[str, dict]:
    return documents(manifests.render())


def test_helm_lint_passes():
    done = subprocess.run([manifests.helm(), "lint", "--strict", str(manifests.CHART)], capture_output=True, text=True)
    assert done.returncode == 0 and "1 chart(s) linted, 0 chart(s) failed" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("name", sorted(manifests.RENDERED))
def test_plain_manifest_is_the_charts_rendering(name):
    """Edited by hand or the chart changed without `make manifests`: this fails, naming the file."""
    assert (manifests.PLAIN / name).read_text() == manifests.manifests()[name], f"run make manifests ({name})"


def test_collector_namespace_is_privileged_and_its_account_has_no_token(rendered):
    namespace, account = rendered["Namespace"], rendered["ServiceAccount"]
    daemonset = rendered["DaemonSet"]
    assert {k: v for k, v in namespace["metadata"]["labels"].items() if k.startswith("pod-security")} == {
        f"pod-security.kubernetes.io/{mode}": "privileged" for mode in ("enforce", "audit", "warn")}
    assert account["automountServiceAccountToken"] is False
    assert account["metadata"]["namespace"] == daemonset["metadata"]["namespace"] == namespace["metadata"]["name"]
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"] and pod["automountServiceAccountToken"] is False


def test_daemonset_has_the_production_fields(rendered):
    spec = rendered["DaemonSet"]["spec"]
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    assert spec["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}
    assert pod["hostPID"] is True and pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["tolerations"] == [{"operator": "Exists"}] and pod["priorityClassName"] == "system-node-critical"
    assert set(container["resources"]["requests"]) == {"cpu", "memory"} and "cpu" not in container["resources"]["limits"]
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["exec"]["command"] == ["otel-gil-collector", "--probe", *container["args"]], probe
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN", "SYS_PTRACE", "DAC_READ_SEARCH"]}
    writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
    assert writable == {"/run/otel-gil", "/tmp"}


def test_socket_group_is_passed_as_a_numeric_gid_the_collector_is_a_member_of():
    """The collector chowns its socket to the group: as a member (supplementalGroups), without CAP_CHOWN."""
    spec = documents(manifests.render("--set", "collector.socketGroup=2000"))["DaemonSet"]["spec"]["template"]["spec"]
    assert spec["containers"][0]["args"][-2:] == ["--socket-group", "2000"]
    assert spec["securityContext"] == {"supplementalGroups": [2000]}


def test_instrumentation_is_in_the_release_namespace_and_alone_without_the_collector():
    kinds = documents(manifests.render("--set", "collector.enabled=false", namespace="shop"))
    assert list(kinds) == ["Instrumentation"] and kinds["Instrumentation"]["metadata"]["namespace"] == "shop"

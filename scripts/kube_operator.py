"""The OpenTelemetry Operator on the cluster of scripts/kube_cluster.py, as its own config/ installs
it (CRDs, ClusterRole, the manager Deployment, its webhooks), from its Go module's sources and a
manager built from them (scripts/kube-bin.sh), with a serving certificate made here instead of
cert-manager's. No kube-proxy: the manager reaches the apiserver at the node's address.

    python3 scripts/kube_operator.py install     (after make kube-cluster)
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kube_cluster as cluster  # noqa: E402

NAMESPACE, NAME = "opentelemetry-operator-system", "opentelemetry-operator"
SERVICE = f"{NAME}-webhook"
VERSION = "v0.140.0"  # scripts/kube-bin.sh's
IMAGE = f"localhost/otel-gil/opentelemetry-operator:{VERSION}"
MODULE = "github.com/open-telemetry/opentelemetry-operator"


def source() -> Path:
    """The Operator module's sources (its CRDs, RBAC and webhook configuration)."""
    done = subprocess.run(["go", "mod", "download", "-json", f"{MODULE}@{VERSION}"], capture_output=True, text=True,
                          check=True)
    return Path(json.loads(done.stdout)["Dir"])


def webhook_certificate() -> tuple[str, str]:
    """The webhook's serving certificate and key (PEM), signed by the cluster's CA."""
    pki = cluster.STATE / "pki"
    key, csr, crt = (pki / f"operator-webhook.{ext}" for ext in ("key", "csr", "crt"))
    if not crt.exists():
        cluster.run("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={SERVICE}.{NAMESPACE}.svc",
                    "-keyout", str(key), "-out", str(csr))
        cluster.run("openssl", "x509", "-req", "-in", str(csr), "-CA", str(pki / "ca.crt"), "-CAkey", str(pki / "ca.key"),
                    "-CAcreateserial", "-days", "365", "-extfile", "/dev/stdin", "-out", str(crt),
                    stdin=f"subjectAltName=DNS:{SERVICE}.{NAMESPACE}.svc,DNS:{SERVICE}.{NAMESPACE}".encode())
    return crt.read_text(), key.read_text()


def manifests(src: Path) -> list[dict]:
    """Everything to apply, in order."""
    crds = [yaml.safe_load(p.read_text()) for p in sorted((src / "config" / "crd" / "bases").glob("*.yaml"))]
    role = yaml.safe_load((src / "config" / "rbac" / "role.yaml").read_text())
    role["metadata"] = {"name": f"{NAME}-manager"}
    crt, key = webhook_certificate()
    ca = base64.b64encode((cluster.STATE / "pki" / "ca.crt").read_bytes()).decode()
    webhooks = list(yaml.safe_load_all((src / "config" / "webhook" / "manifests.yaml").read_text()))
    for configuration in webhooks:
        configuration["metadata"]["name"] = f"{NAME}-{configuration['metadata']['name']}"
        for hook in configuration["webhooks"]:
            hook["clientConfig"]["service"].update(name=SERVICE, namespace=NAMESPACE)
            hook["clientConfig"]["caBundle"] = ca
    labels = {"app.kubernetes.io/name": NAME}
    manager = {
        "name": "manager", "image": IMAGE, "imagePullPolicy": "Never",
        "args": ["--zap-log-level=info", "--enable-leader-election=false"],
        "env": [{"name": "SERVICE_ACCOUNT_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
                {"name": "NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                # no kube-proxy here: the apiserver at the node's address, not at the kubernetes Service's
                {"name": "KUBERNETES_SERVICE_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
                {"name": "KUBERNETES_SERVICE_PORT", "value": str(cluster.APISERVER_PORT)}],
        "ports": [{"containerPort": 9443, "name": "webhook"}],
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": 8081}, "periodSeconds": 2},
        "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "allowPrivilegeEscalation": False,
                            "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]},
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "volumeMounts": [{"name": "cert", "mountPath": "/tmp/k8s-webhook-server/serving-certs", "readOnly": True}],
    }
    return [
        *crds, role,
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": NAME, "namespace": NAMESPACE}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": f"{NAME}-manager"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"{NAME}-manager"},
         "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]},
        {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
         "metadata": {"name": f"{SERVICE}-cert", "namespace": NAMESPACE},
         "stringData": {"tls.crt": crt, "tls.key": key}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": SERVICE, "namespace": NAMESPACE},
         "spec": {"selector": labels, "ports": [{"port": 443, "targetPort": 9443}]}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": NAME, "namespace": NAMESPACE},
         "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
             "metadata": {"labels": labels},
             "spec": {"serviceAccountName": NAME, "containers": [manager],
                      "volumes": [{"name": "cert", "secret": {"secretName": f"{SERVICE}-cert"}}]}}}},
        *webhooks,
    ]


def install() -> None:
    binary = cluster.binaries("operator")
    cluster.import_once(IMAGE, lambda: cluster.scratch_archive(IMAGE, binary / "opentelemetry-operator",
                                                               ["/opentelemetry-operator"]))
    cluster.kubectl("apply", "--server-side", "-f", "-",
                    stdin=yaml.safe_dump_all(manifests(source())).encode(), timeout=300)
    cluster.kubectl("-n", NAMESPACE, "rollout", "status", f"deployment/{NAME}", "--timeout=180s", timeout=200)
    # The apiserver calls the webhook at its Service's endpoints, which lag the rollout: "no endpoints available".
    deadline = time.monotonic() + 60
    while not cluster.kubectl("-n", NAMESPACE, "get", "endpointslices", "-l", f"kubernetes.io/service-name={SERVICE}",
                              "-o", "jsonpath={.items[*].endpoints[?(@.conditions.ready==true)].addresses}").strip():
        if time.monotonic() > deadline:
            raise cluster.ClusterError(f"the Service {SERVICE} has no ready endpoint 60 s after the rollout")
        time.sleep(0.5)
    print(f"kube-operator: the OpenTelemetry Operator {VERSION} serves its webhooks")


if __name__ == "__main__":
    try:
        install()
    except cluster.ClusterError as exc:
        sys.exit(f"kube-operator: {exc}")

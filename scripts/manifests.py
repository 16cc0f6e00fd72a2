"""deploy/kubernetes/'s plain manifests, rendered from the Helm chart (deploy/helm/otel-gil) with
its default values, so that the two cannot drift (tests/unit/test_kube_manifests.py compares them).

    make manifests    (python3 scripts/manifests.py)   write them after a change to the chart
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kube_cluster  # noqa: E402  (scripts/kube_cluster.py: the cached binaries)

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "otel-gil"
PLAIN = ROOT / "deploy" / "kubernetes"
# plain manifest -> the chart's template it is rendered from
RENDERED = {"collector-daemonset.yaml": "templates/collector.yaml", "instrumentation.yaml": "templates/instrumentation.yaml"}
NAMESPACE = "default"  # the plain Instrumentation's (the apps' namespace: change it to yours)
HEADER = "# Rendered from deploy/helm/otel-gil (make manifests): edit the chart, not this file.\n"


def helm() -> str:
    """helm's path (scripts/kube-bin.sh builds it from its Go module once)."""
    return str(kube_cluster.binaries("helm") / "helm")


def render(*args: str, namespace: str = NAMESPACE) -> str:
    """``helm template`` of the chart with ``args`` (e.g. --set, --show-only)."""
    done = subprocess.run([helm(), "template", "otel-gil", str(CHART), "--namespace", namespace, *args],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"helm template failed:\n{done.stderr}")
    return done.stdout


def manifests() -> dict[str, str]:
    """Each plain manifest's text, as the chart renders it."""
    return {name: HEADER + render("--show-only", template) for name, template in RENDERED.items()}


def main() -> int:
    for name, text in manifests().items():
        (PLAIN / name).write_text(text)
        print(f"manifests: wrote deploy/kubernetes/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""docker-compose.yml, checked by a real Compose parser (no engine runs here), and
every build context, Dockerfile and mounted file it names exists in the repo (or, for the
wheels the images install, comes from make wheels)."""

import fnmatch
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from helpers import ROOT, wheels


def compose_config(path: Path) -> subprocess.CompletedProcess:
    compose = shutil.which("docker-compose")
    assert compose, "docker-compose (the parser) is missing: sudo make test installs it"
    return subprocess.run([compose, "-f", str(path), "config"], capture_output=True, text=True, cwd=path.parent)


@pytest.fixture(scope="module")
def config() -> dict:
    done = compose_config(ROOT / "docker-compose.yml")
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


def test_the_parser_rejects_an_invalid_file(tmp_path):
    bad = tmp_path / "docker-compose.yml"
    bad.write_text((ROOT / "docker-compose.yml").read_text().replace("    privileged: true", "    privileged: maybe"))
    assert compose_config(bad).returncode != 0


def test_stack_has_every_part(config):
    assert {"gil-collector", "flask-app", "django-app", "load", "otel-collector", "jaeger", "prometheus"} <= set(
        config["services"]
    )
    collector = config["services"]["gil-collector"]
    assert collector["privileged"] is True and collector["pid"] == "host"
    assert "16686" in str(config["services"]["jaeger"]["ports"])


def test_build_contexts_and_mounts_exist(config):
    for name, service in config["services"].items():
        build = service.get("build")
        if build:
            context = Path(build["context"])
            assert context.is_dir(), name
            assert (context / build.get("dockerfile", "Dockerfile")).is_file(), name
        for volume in service.get("volumes", []):
            source = volume.get("source", "") if isinstance(volume, dict) else str(volume).split(":")[0]
            if source.startswith(str(ROOT)):
                assert Path(source).exists(), (name, source)


def test_apps_reach_the_collector_socket(config):
    for name in ("flask-app", "django-app"):
        service = config["services"][name]
        assert service["environment"]["OTEL_GIL_SOCKET"].startswith("/run/otel-gil/")
        assert any("/run/otel-gil" in str(v) for v in service["volumes"])


def test_images_copy_what_the_repo_and_make_wheels_give(config):
    """Each Dockerfile's COPY sources exist, and each wheel it installs from dist/ is one that
    make wheels builds, for either machine (one file a pattern)."""
    dockerfiles = {ROOT / s["build"]["dockerfile"] for s in config["services"].values() if s.get("build")}
    assert len(dockerfiles) == 2, dockerfiles
    built = wheels.expected_files()
    for dockerfile in dockerfiles:
        text = dockerfile.read_text()
        for line in text.splitlines():
            if line.startswith("COPY "):
                for source in line.split()[1:-1]:
                    assert (ROOT / source).exists() or source == "dist/", (dockerfile, source)
        patterns = re.findall(r"/tmp/dist/(\S+\.whl)", text.replace("$(uname -m)", "MACHINE"))
        assert patterns, dockerfile
        for pattern in patterns:
            for machine in ("x86_64", "aarch64"):
                found = fnmatch.filter(built, pattern.replace("MACHINE", machine))
                assert len(found) == 1, (dockerfile, pattern, machine, found)


def qualified(image: str) -> str:
    """An image name as engines store it: debian:x -> docker.io/library/debian:x."""
    if "/" not in image:
        image = f"library/{image}"
    return image if image.split("/")[0] in ("docker.io", "localhost") else f"docker.io/{image}"


def base(dockerfile: Path) -> str:
    return qualified(re.search(r"^FROM (\S+)", dockerfile.read_text(), re.M)[1])


def test_every_base_image_is_pinned_to_what_images_sh_builds(config):
    """The images the stack pulls and those its Dockerfiles (and the Operator image's) start from
    are exactly the ones scripts/images.sh pulls or builds, at the versions of the Go modules built here."""
    built = set(re.findall(r"docker\.io/[^\s;]+", (ROOT / "scripts" / "images.sh").read_text().split("\nflock 9")[1]))
    ours = {s["image"] for s in config["services"].values() if s.get("build")}
    used = {qualified(s["image"]) for s in config["services"].values() if s["image"] not in ours}
    used |= {base(ROOT / s["build"]["dockerfile"]) for s in config["services"].values() if s.get("build")}
    local_bases = {base(dockerfile) for dockerfile in (ROOT / "images").glob("*/Dockerfile")}
    # the Operator image's final stages, one per architecture (scripts/kube.py builds it)
    used |= set(re.findall(r"docker\.io/\w+/busybox:[\w.]+", (ROOT / "scripts" / "kube.py").read_text()))
    assert built == used | local_bases, (built, used, local_bases)
    jaeger = re.search(r"^version=v1\.(\d+)\.(\d+)", (ROOT / "scripts" / "jaeger.sh").read_text(), re.M)
    assert f"docker.io/jaegertracing/jaeger:2.{int(jaeger[1]) - 63}.{jaeger[2]}" in used  # Jaeger v2.N is module v1.(63+N)
    prometheus = re.search(r"^version=v0\.3(\d\d)\.(\d+)", (ROOT / "scripts" / "prometheus.sh").read_text(), re.M)
    assert f"docker.io/prom/prometheus:v3.{int(prometheus[1])}.{prometheus[2]}" in used  # Prometheus 3.N is module v0.3NN
    manifest = yaml.safe_load((ROOT / "images" / "otelcol" / "manifest.yaml").read_text())
    assert f"docker.io/otel/opentelemetry-collector-contrib:{manifest['dist']['version']}" in used


def test_host_ports_and_sampling_are_variables(config):
    """Nothing machine-specific: each published port is 127.0.0.1:${OTEL_GIL_<SERVICE>_PORT:-default} (scripts/compose.py
    sets them), and the share of calm traces kept is ${OTEL_GIL_SAMPLE_PERCENT:-100}."""
    text = (ROOT / "docker-compose.yml").read_text()
    published = {name for name, s in config["services"].items() if s.get("ports")}
    for name in published:
        variable = f"OTEL_GIL_{name.upper().replace('-', '_')}_PORT"
        assert re.search(rf'"127\.0\.0\.1:\${{{variable}:-\d+}}:\d+"', text), name
    assert config["services"]["otel-collector"]["environment"]["OTEL_GIL_SAMPLE_PERCENT"] == "100"


def test_the_scale_stack_parses_and_its_collectors_use_only_built_components(tmp_path):
    """docker-compose.scale.yml after docker-compose.yml (and the test's record file after both)
    parses; tier 1 balances over the sampler service that exists; and every component the stack's
    collector configurations name is one the Builder's manifest builds (the image has no other)."""
    files = ("docker-compose.yml", "docker-compose.scale.yml", "tests/e2e/compose-scale-record.yml")
    done = subprocess.run([shutil.which("docker-compose"), *(f"--file={f}" for f in files), "config"],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    services = yaml.safe_load(done.stdout)["services"]
    mounted = {v["target"]: Path(v["source"]) for s in services.values() for v in s.get("volumes", [])
               if isinstance(v, dict) and v.get("source", "").startswith(str(ROOT))}
    assert all(source.is_file() for source in mounted.values()), mounted
    gateway = yaml.safe_load((ROOT / "examples" / "compose" / "otel-gateway.yaml").read_text())
    assert gateway["exporters"]["loadbalancing"]["resolver"]["dns"]["hostname"] in services
    manifest = yaml.safe_load((ROOT / "images" / "otelcol" / "manifest.yaml").read_text())
    built = {(kind, m["gomod"].split()[0].rsplit("/", 1)[1]) for kind in ("receivers", "processors", "exporters")
             for m in manifest[kind]}
    for source in {*mounted.values(), *(ROOT / "examples" / "compose").glob("*.yaml")}:
        config = yaml.safe_load(source.read_text())
        if "service" not in config or "pipelines" not in config.get("service", {}):
            continue  # (not a collector's configuration)
        for kind in ("receivers", "processors", "exporters"):
            for name in config.get(kind) or {}:
                module = name.split("/")[0].replace("_", "") + kind[:-1]  # tail_sampling/x -> tailsamplingprocessor
                assert (kind, module) in built, (source.name, kind, name)

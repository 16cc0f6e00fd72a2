"""Kubernetes Pods as a cluster would run them, here with ``podman kube play`` (no cluster, no
Operator webhook): each app Pod is what the OpenTelemetry Operator's webhook makes of a plain
Pod under an Instrumentation resource (deploy/kubernetes/instrumentation.yaml): an init
container of otel-gil/autoinstrumentation-python copies its tree into an emptyDir, the app
container gets the Operator's env. The apps' images have no OpenTelemetry of their own
(examples/kube/Dockerfile), on CPython 3.11 (python:3.11-slim) and 3.13 (Debian sid's).

    make kube-demo    (as root: python3 scripts/kube.py up)   the Pods, then their slowest spans from Jaeger
    make kube-down    (as root: python3 scripts/kube.py down) every Pod and volume kube-demo made

The tests (tests/e2e/test_kubernetes.py) play the same Pods under other names and ports.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "scripts"))
import stack  # noqa: E402  (examples/stack.py: Jaeger)

ENGINE = "podman"  # kube play is podman's (Docker has none)
VERSION = next(line.split('"')[1] for line in (ROOT / "otel_gil" / "version.py").read_text().splitlines()
               if line.startswith("__version__"))
OPERATOR_IMAGE = f"localhost/otel-gil/autoinstrumentation-python:{VERSION}"
BUSYBOXES = {"amd64": "docker.io/amd64/busybox:1.35.0", "arm64": "docker.io/arm64v8/busybox:1.35.0"}  # images.sh's
HOST_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
SID_SLIM = "sid-slim"  # scripts/rootfs.sh's tree with Debian's python3.13
# The app images: CPython version -> (base image, the interpreter in it).
APP_BASES = {"3.11": ("docker.io/library/python:3.11-slim-bookworm", "python3"), "3.13": (None, "python3.13")}
# CPythons the tree has no GIL figures for (the cluster test's): free-threaded (scripts/freethreaded.sh's
# 3.13t, FREE_THREADED_APP_DOCKERFILE; no FastAPI: no cp313t pydantic-core), bullseye's 3.9 (older
# than the tree's SDK) and a musl one (scripts/musl-python.sh's 3.13, MUSL_APP_DOCKERFILE: Flask alone).
EDGE_BASES = {"3.13t": ("free-threaded", None), "3.9": ("bullseye-slim", "python3.9"), "3.13-musl": ("musl", None)}
FREE_THREADED_APP_DOCKERFILE = ROOT / "examples" / "kube" / "free-threaded.Dockerfile"
MUSL_APP_DOCKERFILE = ROOT / "examples" / "kube" / "musl.Dockerfile"
MUSL_LIBC = Path("/lib/x86_64-linux-musl/libc.so")  # Debian's musl (musl-python.sh installs it)
# The musl app's venv: Flask on waitress (gunicorn imports ssl, which musl-python.sh leaves out).
MUSL_PACKAGES = ["flask<4", "waitress<4"]
# The Operator's names (internal/instrumentation of its v0.158.0) and default Python env.
INIT_CONTAINER = VOLUME = "opentelemetry-auto-instrumentation-python"
MOUNT = "/otel-auto-instrumentation-python"
PYTHONPATH_PREFIX, PYTHONPATH_SUFFIX = f"{MOUNT}/opentelemetry/instrumentation/auto_instrumentation", MOUNT
TREES = {"glibc": "/autoinstrumentation/.", "musl": "/autoinstrumentation-musl/."}
# Apps: name -> (venv, command after the port is known, working dir under /opt/otel-gil/examples, server span name).
APPS = {
    "flask": ("wsgi", lambda port: ["gunicorn", "-b", f"127.0.0.1:{port}", "-w", "1", "-k", "gthread", "app:app"],
              "flask_app", "GET /io"),
    "django": ("wsgi", lambda port: ["gunicorn", "-b", f"127.0.0.1:{port}", "-w", "1", "-k", "gthread", "gilsite.wsgi"],
               "django_app", "GET io"),
    "fastapi": ("asgi", lambda port: ["uvicorn", "--host", "127.0.0.1", "--port", str(port), "--loop", "asyncio", "app:app"],
                "async_app", "GET /io"),
}


def musl_server(port: int) -> list[str]:
    """The musl app's command (Flask's example on waitress), as APPS's commands."""
    return ["waitress-serve", f"--listen=127.0.0.1:{port}", "app:app"]


HOG = {"EXAMPLE_HOG_BUSY_MS": "20", "EXAMPLE_HOG_PERIOD_MS": "100"}  # waits to measure, on a shared 2-core host
LOG_LINES = 40
DAEMONSET = ROOT / "deploy" / "kubernetes" / "collector-daemonset.yaml"
COLLECTOR_IMAGE = "docker.io/otel-gil/collector:latest"  # collector/Dockerfile, as docker-compose.yml tags it
SOCKET_MOUNT = "/run/otel-gil"  # where app-pod.yaml mounts the collector's socket directory


class KubeError(RuntimeError):
    """A Pod did not come up or misbehaved; the message ends with its log."""


@dataclass(frozen=True)
class AppPod:
    """One instrumented app Pod: ``app`` of APPS on CPython ``python``, serving on host port ``port``."""

    name: str
    app: str
    python: str
    port: int
    platform: str = "glibc"  # the instrumentation.opentelemetry.io/otel-python-platform annotation
    socket_dir: str = ""  # a collector's socket directory on the host (deploy/kubernetes/app-pod.yaml), if any

    @property
    def service(self) -> str:
        return self.name

    @property
    def span_name(self) -> str:
        return APPS[self.app][3]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def manifest(self, otlp_endpoint: str = stack.OTLP_HTTP) -> dict:
        """The Pod as the Operator's webhook leaves it (hostNetwork: the test's Jaeger is on loopback)."""
        venv, command, workdir, _ = APPS[self.app]
        app_dir = f"/opt/otel-gil/examples/{workdir}"
        # The Operator names this emptyDir VOLUME in every Pod; podman 4.3 plays an emptyDir as a
        # named volume shared by every Pod that names it (one Pod's init container then
        # overwrites the tree another's app has mapped: SIGBUS), so here each Pod's has its name.
        volume = f"{self.name}-{VOLUME}"
        mount = {"name": volume, "mountPath": MOUNT}
        env = {
            # the Instrumentation resource's (deploy/kubernetes/instrumentation.yaml)
            "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_endpoint,
            "OTEL_PROPAGATORS": "tracecontext,baggage",
            "OTEL_TRACES_SAMPLER": "parentbased_always_on",
            # the Operator's defaults for Python, then its common SDK env
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_TRACES_EXPORTER": "otlp",
            # the Operator's otlp for both, made none as instrumentation.yaml says for a Jaeger
            # endpoint (it takes traces only: each metrics or logs export would log a 404)
            "OTEL_METRICS_EXPORTER": "none",
            "OTEL_LOGS_EXPORTER": "none",
            # the app's own PYTHONPATH (Django's settings must import when the instrumentor runs), as
            # the Operator merges it: its tree's sitecustomize first, the app's, the tree
            "PYTHONPATH": f"{PYTHONPATH_PREFIX}:{app_dir}:{PYTHONPATH_SUFFIX}",
            "OTEL_SERVICE_NAME": self.service,
            "OTEL_RESOURCE_ATTRIBUTES": f"k8s.container.name=app,k8s.namespace.name=default,k8s.pod.name={self.name}",
            # the app's own
            "PATH": f"/opt/{venv}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "DJANGO_SETTINGS_MODULE": "gilsite.settings",
            "OTEL_BSP_SCHEDULE_DELAY": "1000",
            **HOG,
        }
        volumes, mounts = [{"name": volume, "emptyDir": {}}], [mount]
        if self.socket_dir:
            env["OTEL_GIL_SOCKET"] = f"{SOCKET_MOUNT}/otel-gil.sock"
            volumes.append({"name": f"{self.name}-socket", "hostPath": {"path": self.socket_dir, "type": "Directory"}})
            mounts.append({"name": f"{self.name}-socket", "mountPath": SOCKET_MOUNT, "readOnly": True})
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": self.name, "labels": {"app.kubernetes.io/part-of": "otel-gil-kube"},
                         "annotations": {"instrumentation.opentelemetry.io/inject-python": "true",
                                         "instrumentation.opentelemetry.io/otel-python-platform": self.platform}},
            "spec": {
                "hostNetwork": True,
                "restartPolicy": "Never",
                "initContainers": [{"name": INIT_CONTAINER, "image": OPERATOR_IMAGE, "imagePullPolicy": "Never",
                                    "command": ["cp", "-r", TREES[self.platform], MOUNT], "volumeMounts": [mount]}],
                "containers": [{"name": "app", "image": app_image(self.python), "imagePullPolicy": "Never",
                                "command": command(self.port), "workingDir": app_dir,
                                "env": [{"name": k, "value": v} for k, v in env.items()], "volumeMounts": mounts}],
                "volumes": volumes,
            },
        }


def collector_pod(name: str, socket_dir: str, capabilities: list[str] | None = None) -> dict:
    """deploy/kubernetes/collector-daemonset.yaml's Pod template as a Pod (podman plays no
    DaemonSet), with this repo's collector image, its socket on ``socket_dir`` of the host and
    ``capabilities`` instead of the file's, if given."""
    daemonset = daemonset_manifest()
    spec = daemonset["spec"]["template"]["spec"]
    container = spec["containers"][0]
    container.update(image=COLLECTOR_IMAGE, imagePullPolicy="Never")
    # podman runs probes through systemd timers (its init may fail where it cannot make one) and
    # this machine has no systemd: the probes are a cluster's (otel-gil-collector --probe, unit-tested).
    for probe in ("readinessProbe", "livenessProbe"):
        container.pop(probe)
    if capabilities is not None:
        container["securityContext"]["capabilities"]["add"] = capabilities
    next(v for v in spec["volumes"] if v["name"] == "socket")["hostPath"]["path"] = socket_dir
    # podman 4.3 takes a Pod's seccomp profile from the (pre-1.19) annotation, not from seccompProfile
    seccomp = container["securityContext"]["seccompProfile"]["type"].lower()
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": daemonset["metadata"]["labels"],
                         "annotations": {"seccomp.security.alpha.kubernetes.io/pod": seccomp}},
            "spec": {**spec, "restartPolicy": "Never"}}


def daemonset_manifest() -> dict:
    """The DaemonSet of collector-daemonset.yaml (its namespace and ServiceAccount precede it)."""
    return next(d for d in yaml.safe_load_all(DAEMONSET.read_text()) if d and d["kind"] == "DaemonSet")


def app_image(python: str) -> str:
    return f"localhost/otel-gil/kube-app:{python}"


def run(*argv: str, timeout: float = 1800, check: bool = True) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise KubeError(f"{' '.join(argv)} failed:\n{done.stdout}{done.stderr}")
    return done.stdout


def build_images() -> None:
    """The Operator image (make operator-image's recipe) and the app images, by the engine's build
    cache: a rebuild only where a recipe or what it copies changed. Needs the base images
    (scripts/images.sh) and dist/'s wheels (make wheels)."""
    build_operator_image()
    run(ENGINE, "build", "-q", "-f", str(ROOT / "collector/Dockerfile"), "-t", COLLECTOR_IMAGE, str(ROOT))
    build_app_images()


def build_operator_image(arch: str = "") -> str:
    """make operator-image's (the build host's architecture), or for ``arch`` (arm64): its tag. The
    build stage runs here whatever ``arch`` (pip fetches the target's wheels), the final stage is
    that architecture's busybox (scripts/images.sh)."""
    image, args = OPERATOR_IMAGE, ["--build-arg", f"BUSYBOX={BUSYBOXES[HOST_ARCH]}"]
    if arch:
        # no --arch: podman 4.3 then looks for every stage's base of that architecture (pulls);
        # the image takes its final stage's base's
        image, args = f"{OPERATOR_IMAGE}-{arch}", ["--build-arg", f"TARGETARCH={arch}",
                                                   "--build-arg", f"BUSYBOX={BUSYBOXES[arch]}"]
    run(ENGINE, "build", "-q", *args, "-f", str(ROOT / "deploy/kubernetes/autoinstrumentation-python/Dockerfile"),
        "-t", image, str(ROOT))
    return image


def build_app_images(bases: dict | None = None) -> None:
    """The app images (no OpenTelemetry in them) of ``bases`` (APP_BASES), by the engine's build cache."""
    for python, (base, interpreter) in (bases or APP_BASES).items():
        if base == "musl":
            build_musl_image(app_image(python))
            continue
        asgi = base != "free-threaded"
        if not asgi:
            base, interpreter = free_threaded_image()
        elif base is None or not base.startswith("docker.io/"):
            base = tree_image(base or SID_SLIM)
        run(ENGINE, "build", "-q", "-f", str(ROOT / "examples/kube/Dockerfile"), "--build-arg", f"BASE={base}",
            "--build-arg", f"PYTHON={interpreter}", "--build-arg", f"ASGI={'1' if asgi else ''}",
            "-t", app_image(python), str(ROOT))


def free_threaded_image() -> tuple[str, str]:
    """scripts/freethreaded.sh's 3.13t at its own path (its rpath) on python:3.11-slim-bookworm's
    libraries, without what an app does not run (free-threaded.dockerignore): the image (built once
    per build of it and recipe) and the interpreter's path."""
    python = Path(run(str(ROOT / "scripts" / "freethreaded.sh"), "3.13").split()[-1])
    prefix = python.parent.parent
    ignore = FREE_THREADED_APP_DOCKERFILE.with_suffix(".dockerignore")
    recipe = hashlib.sha256(FREE_THREADED_APP_DOCKERFILE.read_bytes() + ignore.read_bytes()).hexdigest()[:12]
    image = f"localhost/otel-gil/python-free-threaded:{prefix.name}-{recipe}"
    if subprocess.run([ENGINE, "image", "exists", image]).returncode != 0:
        run(ENGINE, "build", "-q", "-f", str(FREE_THREADED_APP_DOCKERFILE), "--ignorefile", str(ignore),
            "--build-arg", f"PREFIX={prefix}", "-t", image, str(prefix))
    return image, str(python)


def musl_python() -> Path:
    """scripts/musl-python.sh's CPython 3.13 on musl (built once, cached): its path."""
    return Path(run(str(ROOT / "scripts" / "musl-python.sh"), "3.13").split()[-1])


def build_musl_image(image: str) -> None:
    """MUSL_APP_DOCKERFILE's ``image``, by the engine's build cache, from a context made here:
    musl's libc, scripts/musl-python.sh's CPython 3.13 (without its static libpython and headers),
    MUSL_PACKAGES as pip on this host installs them for it (musllinux wheels; their scripts
    pointed at the image's venv), the examples."""
    prefix = musl_python().parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        context = Path(tmp)
        shutil.copy(MUSL_LIBC, context / "libc.so")
        shutil.copytree(prefix, context / "python", symlinks=True,
                        ignore=shutil.ignore_patterns("config-3.*", "include"))
        shutil.copytree(ROOT / "examples", context / "examples", ignore=shutil.ignore_patterns("__pycache__"))
        packages = context / "site-packages"
        run(sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile", "--target",
            str(packages), "--only-binary=:all:", "--implementation", "cp", "--python-version", "3.13",
            "--platform", f"musllinux_1_2_{os.uname().machine}", *MUSL_PACKAGES, timeout=600)
        (packages / "bin").rename(context / "bin")
        for script in (context / "bin").iterdir():
            lines = script.read_text().splitlines(keepends=True)
            script.write_text("".join(["#!/opt/wsgi/bin/python\n", *lines[1:]]))
        run(ENGINE, "build", "-q", "-f", str(MUSL_APP_DOCKERFILE), "-t", image, str(context))


def tree_image(name: str) -> str:
    """scripts/rootfs.sh's tree ``name`` as an image (imported once per tree: the tag is its recipe hash)."""
    tree = Path(run(str(ROOT / "scripts" / "rootfs.sh"), name).split()[-1])
    name, recipe = tree.name.rsplit("-", 1)
    image = f"localhost/otel-gil/{name}:{recipe}"
    if subprocess.run([ENGINE, "image", "exists", image]).returncode != 0:
        tar = subprocess.Popen(["tar", "-C", str(tree), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run([ENGINE, "import", "--change",
                                   "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                   "--change", 'CMD ["bash"]', "-", image], stdin=tar.stdout, capture_output=True, text=True)
        tar.wait()
        if imported.returncode != 0 or tar.returncode != 0:
            raise KubeError(f"importing {tree} as {image} failed:\n{imported.stderr}")
    return image


def play(pods: list[AppPod | dict], workdir: Path, name: str = "pods") -> Path:
    """The Pods (AppPods, or manifests) played from one YAML file in ``workdir``: the file, for down()."""
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump_all([pod if isinstance(pod, dict) else pod.manifest() for pod in pods], sort_keys=False))
    run(ENGINE, "kube", "play", str(path), timeout=300)
    return path


def down(path: Path) -> None:
    """Every Pod of the file, its containers and their volumes (the emptyDirs)."""
    run(ENGINE, "kube", "down", str(path), timeout=120, check=False)


def logs(pod: str, container: str = "app", lines: int = LOG_LINES) -> str:
    done = subprocess.run([ENGINE, "logs", "--tail", str(lines), f"{pod}-{container}"], capture_output=True, text=True)
    return done.stdout + done.stderr


def exit_code(container: str, timeout: float = 30) -> int:
    """The container's exit code once it exited (KubeError if it runs on after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        status, code = run(ENGINE, "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", container).split()
        if status == "exited":
            return int(code)
        if time.monotonic() > deadline:
            raise KubeError(f"{container} still {status} after {timeout:.0f} s:\n{logs(container.rsplit('-', 1)[0])}")
        time.sleep(0.5)


def failed(pod: AppPod, what: str) -> KubeError:
    return KubeError(f"pod {pod.name}: {what}; its app's last log lines:\n{logs(pod.name)}")


def wait_ready(pods: list[AppPod], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    for pod in pods:
        while not stack.http_ok(pod.url + "/health"):
            if time.monotonic() > deadline:
                raise failed(pod, f"{pod.url}/health did not answer within {timeout:.0f} s")
            time.sleep(0.5)


def get(url: str) -> int:
    """GET ``url`` (no proxy): its status."""
    return _get(url)[0]


def get_text(url: str) -> str:
    """GET ``url`` (no proxy): its body."""
    return _get(url)[1]


def _get(url: str) -> tuple[int, str]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=60) as resp:
        return resp.status, resp.read().decode()


DEMO = [AppPod("kube-flask-311", "flask", "3.11", 8300), AppPod("kube-fastapi-311", "fastapi", "3.11", 8301),
        AppPod("kube-django-313", "django", "3.13", 8302)]
DEMO_DIR = Path(tempfile.gettempdir()) / "otel-gil-kube-demo"


def demo_up() -> None:
    import demo  # scripts/demo.py: its table of spans

    print("kube: images (the first run builds them)...", flush=True)
    build_images()
    DEMO_DIR.mkdir(exist_ok=True)
    play(DEMO, DEMO_DIR)
    wait_ready(DEMO)
    if not stack.http_ok(f"{stack.JAEGER_QUERY}/api/services"):
        jaeger = stack.start_jaeger(DEMO_DIR / "jaeger.log")
        (DEMO_DIR / "jaeger.pid").write_text(str(jaeger.proc.pid))
    for pod in DEMO:
        for _ in range(30):
            get(pod.url + "/io")
    for pod in DEMO:
        spans = [s for s in stack.wait_for_spans(pod.service, pod.span_name, 30, timeout=60)
                 if s["tags"].get("span.kind") == "server" and "gil.wait_ms" in s["tags"]]
        if not spans:
            raise failed(pod, "no server span with GIL figures reached Jaeger within 60 s")
        print(f"\n{pod.name} ({pod.app} on CPython {pod.python}, instrumented by the Operator's init container): "
              f"slowest of {len(spans)} server spans, from Jaeger\n")
        print(demo.async_table(spans, 5) if pod.app == "fastapi" else demo.table(spans, 5))
    print(f"\nJaeger {stack.JAEGER_QUERY}; the Pods stay up: make kube-down removes them")


def demo_down() -> None:
    down(DEMO_DIR / "pods.yaml")
    pid = DEMO_DIR / "jaeger.pid"
    if pid.exists():
        subprocess.run(["kill", pid.read_text()], check=False)
        pid.unlink()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("up", "down"))
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("kube: podman kube play and the collector need root: make kube-demo (it uses sudo)")
    try:
        demo_up() if args.command == "up" else demo_down()
    except (KubeError, stack.StackError) as exc:
        print(f"kube: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The Operator image's trees as the CPythons a Pod may have meet them (PYTHONPATH as the Operator
sets it, the tree first): the arm64 image (``make operator-image-arm64``) on arm64 busybox as user
1000, every C extension of its tree aarch64 and loaded by sid's arm64 CPythons under
qemu-user-static; the amd64 image's tree under a free-threaded CPython (no crash: its spans say
gil_disabled) and under 3.9, which the tree lacks (the tree steps aside: the app runs on its own
packages); its musl tree under a musl CPython (its extensions load, its spans say why they carry
no figures)."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import kube  # noqa: E402
import wheels  # noqa: E402

ARM64_PYTHONS = ("3.13", "3.14", "3.15")  # scripts/rootfs.sh's sid-arm64
EM_AARCH64 = 183  # ELF e_machine
TREE, MUSL_TREE = "autoinstrumentation/", "autoinstrumentation-musl/"  # the glibc and musl trees in the image
MOUNT = "/mnt"  # where the tree is bound in a Debian tree (a mount namespace of its own: the cache is not written)
PYTHONPATH = f"{MOUNT}/opentelemetry/instrumentation/auto_instrumentation:{MOUNT}"
# Each C extension of the tree that this interpreter picks (its own EXT_SUFFIX first, then abi3),
# imported: {module: null or the error}.
LOAD_ALL = """
import importlib, importlib.machinery, json, os, sys
root, seen, result = sys.argv[1], set(), {}
sys.path.insert(0, root)
for suffix in importlib.machinery.EXTENSION_SUFFIXES[:-1]:
    for d, _, files in os.walk(root):
        for f in files:
            if f.endswith(suffix):
                name = os.path.relpath(os.path.join(d, f[: -len(suffix)]), root).replace(os.sep, ".")
                if name not in seen:
                    seen.add(name)
                    try:
                        importlib.import_module(name)
                        result[name] = None
                    except Exception as exc:
                        result[name] = repr(exc)
print(json.dumps(result))
"""
SPAN = """
import json, sys
from opentelemetry import trace
with trace.get_tracer("app").start_as_current_span("work") as span:
    sum(range(100_000))
print(json.dumps({"attributes": dict(getattr(span, "attributes", None) or {}),
                  "duration_ms": (span.end_time - span.start_time) / 1e6 if span.end_time else None}))
"""
OTEL_ENV = {"OTEL_SERVICE_NAME": "app", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_TRACES_EXPORTER": "none",
            "OTEL_METRICS_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none"}


def extract_tree(image: str, dest: Path, tree: str = TREE) -> Path:
    """The image's ``tree`` (/autoinstrumentation), exported into ``dest``."""
    container = kube.run(kube.ENGINE, "create", image, "true").strip()
    try:
        export = subprocess.Popen([kube.ENGINE, "export", container], stdout=subprocess.PIPE)
        with tarfile.open(fileobj=export.stdout, mode="r|") as tar:
            tar.extractall(dest, filter=lambda m, _: m if m.name.removeprefix("./").startswith(tree) else None)
        assert export.wait() == 0
    finally:
        kube.run(kube.ENGINE, "rm", container, check=False)
    return dest / tree


def in_tree(rootfs: Path, tree: Path, *argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``argv`` chrooted in ``rootfs`` as nobody, ``tree`` bound at MOUNT, a clean environment."""
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", **(env or {})}
    script = ('mount --bind "$1" "$0/mnt" && mount -t proc proc "$0/proc" && shift'
              ' && exec chroot --userspec=65534:65534 "$0" "$@"')
    return subprocess.run(["unshare", "--mount", "--fork", "sh", "-c", script, str(rootfs), str(tree), "env", "-i",
                           *(f"{k}={v}" for k, v in env.items()), *argv], capture_output=True, text=True, timeout=900)


def elf_machine(path: Path) -> int:
    return int.from_bytes(path.read_bytes()[18:20], "little")


@pytest.fixture(scope="module")
def arm64_tree(tmp_path_factory) -> Path:
    try:
        image = kube.build_operator_image("arm64")
    except kube.KubeError as exc:
        pytest.fail(f"make operator-image-arm64 failed (images and wheels first: make images wheels): {exc}")
    config = json.loads(kube.run(kube.ENGINE, "image", "inspect", image))[0]
    assert (config["Architecture"], config["Config"].get("User")) == ("arm64", "1000:1000"), config
    return extract_tree(image, tmp_path_factory.mktemp("arm64"))


def test_arm64_tree_is_aarch64(arm64_tree):
    """Every C extension of the arm64 image's tree is an aarch64 ELF, otel-gil's for each CPython."""
    sos = list(arm64_tree.rglob("*.so"))
    assert sos and {str(p.relative_to(arm64_tree)): elf_machine(p) for p in sos} == \
        {str(p.relative_to(arm64_tree)): EM_AARCH64 for p in sos}
    for version in ("310", "311", "312", "313", "313t", "314", "315"):
        assert (arm64_tree / "otel_gil" / f"_inprocess.cpython-{version}-aarch64-linux-gnu.so").exists(), version


@pytest.mark.parametrize("version", ARM64_PYTHONS)
def test_arm64_tree_extensions_load_under_qemu(arm64_tree, version):
    """sid's arm64 CPython ``version`` (qemu-user-static) imports each C extension of the tree that
    it picks: otel-gil's two C parts among them."""
    rootfs = wheels.tree_path("sid-arm64")
    done = in_tree(rootfs, arm64_tree, f"python{version}", "-c", LOAD_ALL, MOUNT)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout)
    assert {"otel_gil._inprocess", "otel_gil._fastspan", "wrapt._wrappers"} <= loaded.keys(), loaded
    assert {m: e for m, e in loaded.items() if e} == {}, loaded
    print(f"arm64 CPython {version} under qemu: {len(loaded)} C extensions of the tree loaded")


def test_arm64_app_with_the_tree_has_figures_under_qemu(arm64_tree):
    """sid's arm64 CPython 3.13 with the tree on PYTHONPATH as the Operator sets it (its
    sitecustomize, the distro, every instrumentor: 100 s under qemu): a lone thread's span carries
    figures, no gil.status, and held the GIL throughout (its hold over 95 % of its duration)."""
    done = in_tree(wheels.tree_path("sid-arm64"), arm64_tree, f"python{ARM64_PYTHONS[0]}", "-c", SPAN,
                   env={**OTEL_ENV, "PYTHONPATH": PYTHONPATH})
    assert done.returncode == 0, done.stderr[-3000:]
    span = json.loads(done.stdout)
    attributes = span["attributes"]
    assert "gil.status" not in attributes, (span, done.stderr[-3000:])
    assert attributes["gil.hold_ms"] > 0.95 * span["duration_ms"], (span, done.stderr[-3000:])


@pytest.fixture(scope="module")
def amd64_image() -> str:
    try:
        return kube.build_operator_image()
    except kube.KubeError as exc:
        pytest.fail(f"make operator-image failed (images and wheels first: make images wheels): {exc}")


@pytest.fixture(scope="module")
def amd64_tree(amd64_image, tmp_path_factory) -> Path:
    return extract_tree(amd64_image, tmp_path_factory.mktemp("amd64"))


@pytest.fixture(scope="module")
def musl_tree(amd64_image, tmp_path_factory) -> Path:
    return extract_tree(amd64_image, tmp_path_factory.mktemp("musl"), MUSL_TREE)


def _span_with_tree(python: str, tree: Path) -> tuple[dict, str]:
    """SPAN run by ``python`` with ``tree`` on PYTHONPATH as the Operator sets it: the span's
    attributes, and what the process wrote to stderr."""
    done = subprocess.run([python, "-c", SPAN], capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", **OTEL_ENV, "PYTHONPATH": PYTHONPATH.replace(MOUNT, str(tree))})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)["attributes"], done.stderr[-3000:]


def test_free_threaded_app_with_the_tree_says_gil_disabled(amd64_tree):
    """A free-threaded CPython (3.13t, scripts/freethreaded.sh's) with the tree on PYTHONPATH as the
    Operator sets it: it runs (the tree's .abi3.so, psutil's and protobuf's, crashed it with a
    segfault), its span says gil_disabled and carries no GIL figure."""
    attributes, stderr = _span_with_tree(str(wheels.host_python("3.13t")), amd64_tree)
    assert attributes.get("gil.status") == "gil_disabled", (attributes, stderr)
    assert not {"gil.wait_ms", "gil.hold_ms"} & attributes.keys(), attributes


def test_python_the_tree_lacks_runs_uninstrumented(amd64_tree):
    """Bullseye's CPython 3.9 (the tree's SDK requires 3.10) with the tree on PYTHONPATH: the tree
    takes itself off sys.path and says so in one line, so the app runs on its own packages, none of
    the tree's shadowing them (the tree's opentelemetry-api, 3.10 syntax, crashed an app importing
    it), and uninstrumented: no span can say why."""
    app = "import json, sys; print(json.dumps([p for p in sys.path if p.startswith('/mnt')])); import opentelemetry"
    done = in_tree(wheels.tree_path("bullseye-slim"), amd64_tree, "python3.9", "-c", app,
                   env={**OTEL_ENV, "PYTHONPATH": PYTHONPATH})
    assert json.loads(done.stdout) == [], done.stdout
    assert "No module named 'opentelemetry'" in done.stderr, done.stderr
    said = "otel-gil: CPython 3.9 is older than the instrumentation tree's 3.10: not instrumented\n"
    assert done.stderr.startswith(said), done.stderr


def test_musl_cpython_loads_the_musl_tree_and_its_spans_say_why(musl_tree):
    """musl's CPython 3.13 (scripts/musl-python.sh's, on musl's libc alone) with the musl tree:
    every C extension of the tree it picks (musllinux wheels': wrapt's, psutil's,
    charset-normalizer's) imports; with the tree on PYTHONPATH as the Operator sets it, a span says
    unsupported_interpreter (otel-gil there has no C parts) and carries no GIL figure."""
    python = str(kube.musl_python())
    done = subprocess.run([python, "-c", LOAD_ALL, str(musl_tree)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout)
    assert {"wrapt._wrappers", "psutil._psutil_linux", "charset_normalizer.md"} <= loaded.keys(), loaded
    assert {m: e for m, e in loaded.items() if e} == {}, loaded
    attributes, stderr = _span_with_tree(python, musl_tree)
    assert attributes.get("gil.status") == "unsupported_interpreter", (attributes, stderr)
    assert not {"gil.wait_ms", "gil.hold_ms"} & attributes.keys(), attributes

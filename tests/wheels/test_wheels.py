"""The wheels of dist/ (``make wheels``) as users get them, not the checkout: each into a fresh
venv of the CPython it is for, by ``pip install --no-index --only-binary :all:`` from a
directory outside the checkout with a wheelhouse of otel-gil's dependencies (filled by that
venv's own pip, so with its own tags; cached), then the hog scenario with the in-process
backend, whose figures must match the PyDLL ground truth while otel_gil and both C parts are
imported from that venv.

- x86_64, on this host: pyenv's 3.9-3.13 (``make matrix``), as root (they live in its home);
- x86_64, in Debian trees with no compiler and no Python.h (scripts/rootfs.sh), as nobody:
  bullseye's 3.9 (glibc 2.31) and sid's 3.13, 3.14, 3.15; ground truth within 5 %;
- aarch64, in sid's arm64 tree under qemu-user-static, as nobody: 3.13, 3.14, 3.15 install
  (the three at once), the hooks install, and the hog's hold is seen within 10 %;
- free-threaded x86_64 (3.13t, scripts/freethreaded.sh's): the GIL stays off throughout
  (helpers.check_free_threaded) and opentelemetry-instrument exports over OTLP/HTTP.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import zipfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import pytest

from helpers import (DIST, FREE_THREADED, FREE_THREADED_WORKLOAD, MATRIX, NOBODY, ROOT, SCENARIOS, built_wheel,
                     check_free_threaded, check_functions, check_hog_ground_truth, check_tasks_ground_truth,
                     report_during_bursts, span, start_target, wheels, within)

# Debian trees with no compiler (scripts/rootfs.sh NAME): the machine and the CPythons tested in each.
TREES = {
    "bullseye-slim": ("x86_64", ("3.9",)),
    "sid-slim": ("x86_64", ("3.13", "3.14", "3.15")),
    "sid-arm64": ("aarch64", ("3.13", "3.14", "3.15")),
}
CACHE = Path(os.environ.get("OTEL_GIL_CACHE", "/var/cache/otel-gil"))
HOG = ("hog", "/nonexistent/otel-gil.sock", "--bursts", "5", "--burst-ms", "100")
WORKLOADS = (SCENARIOS, SCENARIOS.parent / "own_time.py")  # scenarios.py imports own_time
COMPILERS = ("cc", "gcc", "c99", "clang", "x86_64-linux-gnu-gcc", "aarch64-linux-gnu-gcc")
TIMEOUT_S = 1200  # pip under qemu


def _pip_env() -> dict:
    """What pip needs of this machine's environment (a proxy, its CA), none of its own wheel dirs."""
    return {k: v for k, v in os.environ.items()
            if (k.startswith("PIP_") and k != "PIP_FIND_LINKS") or k.lower().endswith("_proxy")}


class Place:
    """Where a venv is made and run: this host (``tree`` None) or a Debian tree, entered with
    chroot in a mount namespace of its own with /proc, and with a clean environment."""

    def __init__(self, tree: Path | None, wheelhouse: str = "") -> None:
        self.tree = tree
        base = tree / "tmp" if tree else Path(tempfile.gettempdir())
        self.host_dir = Path(tempfile.mkdtemp(prefix="otel-gil-wheel-", dir=base))
        os.chmod(self.host_dir, 0o755)  # nobody runs the venv
        self.dir = "/" + str(self.host_dir.relative_to(tree)) if tree else str(self.host_dir)
        # pip's downloads, kept with the tree (its recipe) or in the cache; ``wheelhouse``: a
        # subdirectory of its own, for a pip that runs beside others (pip download writes in place)
        self.wheelhouse = ("/var/cache/otel-gil-wheelhouse" if tree else str(CACHE / "wheelhouse")) \
            + (f"/{wheelhouse}" if wheelhouse else "")

    def run(self, *argv: str, user: int | None = None, env: dict | None = None, ok=(0,)) -> subprocess.CompletedProcess:
        env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent" if user else "/root", "LANG": "C.UTF-8",
               **_pip_env(), **(env or {})}
        if self.tree is None:
            assert user is None, "the host's pyenv CPythons live in root's home"
            cmd = list(argv)
        else:
            chroot = ["chroot", *([f"--userspec={user}:{user}"] if user is not None else []), str(self.tree)]
            cmd = ["unshare", "--mount", "--fork", "sh", "-c", 'mount -t proc proc "$0/proc" && exec "$@"',
                   str(self.tree), *chroot, "env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=self.host_dir,
                              env=env if self.tree is None else None)  # never the checkout: nothing imported from it
        assert done.returncode in ok, f"{argv} failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        return done

    def close(self) -> None:
        shutil.rmtree(self.host_dir)


def requirements(wheel: Path) -> list[str]:
    """The wheel's own dependencies (its METADATA's Requires-Dist, extras left out)."""
    with zipfile.ZipFile(wheel) as whl:
        metadata = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
        lines = whl.read(metadata).decode().splitlines()
    return [line.split(":", 1)[1].strip() for line in lines
            if line.startswith("Requires-Dist:") and "extra ==" not in line]


def install(place: Place, python: str, *wheels_: Path, venv_options: tuple[str, ...] = ()) -> str:
    """A fresh venv of ``python`` in ``place`` with only ``wheels_`` and their dependencies (the
    first wheel's, as that venv's own pip resolves them: 3.9 gets an older OpenTelemetry),
    installed offline from a directory outside the checkout; the venv's path as ``place`` sees it."""
    for source in wheels_:
        shutil.copy2(source, place.host_dir / source.name)
    (place.host_dir / "requirements.txt").write_text("\n".join(requirements(wheels_[0])) + "\n")
    venv, work = f"{place.dir}/venv", place.dir
    place.run(python, "-m", "venv", *venv_options, venv)
    place.run(f"{venv}/bin/pip", "download", "-q", "--only-binary", ":all:", "-d", place.wheelhouse,
              "-r", f"{work}/requirements.txt")
    place.run(f"{venv}/bin/pip", "install", "-q", "--no-index", "--only-binary", ":all:", "--find-links",
              place.wheelhouse, *(f"{work}/{w.name}" for w in wheels_))
    return venv


def run_hog(place: Place, version: str, venv: str, wheel: Path, tasks: bool = False) -> dict:
    """The hog scenario run in ``venv``, where ``wheel`` is installed, with the in-process
    backend (as nobody in a tree; the host's pyenv lives in root's home); its report, and with
    ``tasks`` the tasks scenario's too (``report["tasks"]``: asyncio requests' own figures)."""
    work = place.dir
    for script in WORKLOADS:
        shutil.copy2(script, place.host_dir / script.name)
    user = NOBODY if place.tree else None

    def run(*args: str) -> dict:
        done = place.run(f"{venv}/bin/python", f"{work}/scenarios.py", *args, user=user, env={"OTEL_GIL_BACKEND": "inprocess"})
        report = json.loads(done.stdout)
        report["stderr"] = done.stderr
        assert report["backend"] == "inprocess" and report["uid"] == (user or os.getuid()), report["stderr"]
        site = f"{venv}/lib/python{version}/site-packages/otel_gil/"
        suffix = next(t.ext_suffix for t in wheels.targets() if t.wheel_name() == wheel.name)
        for module in ("otel_gil", *wheels.extension_modules()):
            assert report["modules"].get(module, "").startswith(site), (module, report["modules"])
        for module in wheels.extension_modules():
            assert report["modules"][module].endswith(suffix), report["modules"]
        return report

    report = run(*HOG)
    if tasks:
        report["tasks"] = run("tasks", HOG[1])
    return report


@pytest.fixture(scope="session")
def trees() -> dict:
    """name -> path of the cached Debian trees (scripts/rootfs.sh), each made on first use."""
    paths = {}

    def get(name: str) -> Path:
        if name not in paths:
            done = subprocess.run([str(ROOT / "scripts" / "rootfs.sh"), name], capture_output=True, text=True)
            assert done.returncode == 0, f"scripts/rootfs.sh {name} failed:\n{done.stderr}"
            paths[name] = Path(done.stdout.split()[-1])
            compilers = [c for c in COMPILERS if (paths[name] / "usr" / "bin" / c).exists()]
            headers = list((paths[name] / "usr" / "include").glob("python3*/Python.h"))
            assert not compilers and not headers, f"{name} is no tree without a compiler: {compilers} {headers}"
        return paths[name]

    return get


@pytest.fixture
def place(request):
    places = []

    def make(tree: Path | None) -> Place:
        places.append(Place(tree))
        return places[-1]

    yield make
    for p in places:
        p.close()


Venvs = dict[tuple[str, str], tuple[Place, Future]]


@contextlib.contextmanager
def installed_at_once(trees, targets: list[tuple[str, str]], machine: str) -> Iterator[Venvs]:
    """(tree, version) -> (its place, the future of install()'s venv) for the ``machine`` wheel
    of each target (tree ``host``: this host's pyenv CPython), installed all at once and done
    when every one is: the hogs, which time the GIL, then run with no install busy beside them."""
    places = {(tree, v): Place(None if tree == "host" else trees(tree), wheelhouse=v) for tree, v in targets}

    def install_one(tree: str, version: str) -> str:
        python = wheels.pyenv_python(version) if tree == "host" else f"/usr/bin/python{version}"
        assert python, f"no pyenv CPython {version} (make matrix needs them too)"
        return install(places[tree, version], str(python), built_wheel(version, machine))

    try:
        with ThreadPoolExecutor(len(places)) as pool:
            venvs = {key: pool.submit(install_one, *key) for key in places}
        yield {key: (places[key], venvs[key]) for key in places}
    finally:
        for where in places.values():
            where.close()


def hog_in(venvs: Venvs, tree: str, version: str, machine: str, tasks: bool = False) -> dict:
    """run_hog's report in the venv ``venvs`` made for (tree, version)."""
    where, venv = venvs[tree, version]
    report = run_hog(where, version, venv.result(), built_wheel(version, machine), tasks)
    assert report["machine"] == machine
    return report


X86_64 = [("host", v) for v in MATRIX] + [(t, v) for t, (m, vs) in TREES.items() if m == "x86_64" for v in vs]
AARCH64 = [(t, v) for t, (machine, vs) in TREES.items() if machine == "aarch64" for v in vs]


@pytest.fixture(scope="module")
def x86_64_venvs(trees) -> Iterator[Venvs]:
    """Every x86_64 wheel's venv, made at once (pip's downloads overlap)."""
    with installed_at_once(trees, X86_64, "x86_64") as venvs:
        yield venvs


@pytest.fixture(scope="module")
def aarch64_venvs(trees) -> Iterator[Venvs]:
    """Every aarch64 wheel's venv, made at once: pip under qemu keeps a core busy ~3.3 minutes a
    wheel, so two cores make the three in ~5 minutes instead of 10."""
    with installed_at_once(trees, AARCH64, "aarch64") as venvs:
        yield venvs


@pytest.mark.parametrize("version", MATRIX)
def test_wheel_on_this_host(version, x86_64_venvs):
    report = hog_in(x86_64_venvs, "host", version, "x86_64", tasks=True)
    check_hog_ground_truth(report)
    check_tasks_ground_truth(report["tasks"])


@pytest.mark.parametrize("tree,version", X86_64[len(MATRIX):])
def test_wheel_without_a_compiler(tree, version, x86_64_venvs):
    report = hog_in(x86_64_venvs, tree, version, "x86_64", tasks=True)
    check_hog_ground_truth(report)
    check_tasks_ground_truth(report["tasks"])


@pytest.mark.parametrize("tree,version", AARCH64)
def test_aarch64_wheel_under_qemu(tree, version, aarch64_venvs):
    report = hog_in(aarch64_venvs, tree, version, "aarch64")
    hog = span(report, "hog")["attributes"]
    assert "gil.status" not in hog, report["stderr"]
    truth_ms = sum(report["truth"]["bursts_ns"]) / 1e6
    assert within(hog["gil.hold_ms"], truth_ms, rel=0.10), (hog, truth_ms)


@contextlib.contextmanager
def otlp_http_receiver() -> Iterator[tuple[str, list[bytes]]]:
    """An OTLP/HTTP endpoint on loopback (its URL) and the trace export bodies it was sent."""
    bodies: list[bytes] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.path == "/v1/traces":
                bodies.append(body)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", bodies
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("version", FREE_THREADED)
def test_free_threaded_wheel(version, place):
    """The cp3Xt wheel as a user of that build gets it: a fresh venv with every dependency a
    wheel (no grpcio, which has none for it: the OTLP exporter over HTTP instead), otel_gil and
    its C part from the venv, the GIL off throughout; and under opentelemetry-instrument with the
    distro, out of the box (no OTEL_EXPORTER_OTLP_PROTOCOL: the wheel's .pth makes HTTP the default
    where gRPC is missing), spans exported saying gil_disabled."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    where = place(None)
    wheel = built_wheel(version, "x86_64")
    names = {re.split(r"[^A-Za-z0-9._-]", r, maxsplit=1)[0] for r in requirements(wheel)}
    assert not names & {"grpcio", "opentelemetry-exporter-otlp", "opentelemetry-exporter-otlp-proto-grpc"}, names
    venv = install(where, str(wheels.host_python(version)), wheel)
    shutil.copy2(FREE_THREADED_WORKLOAD, where.host_dir / FREE_THREADED_WORKLOAD.name)
    report = check_free_threaded(where.run(f"{venv}/bin/python", "-W", "error::RuntimeWarning",
                                           f"{where.dir}/{FREE_THREADED_WORKLOAD.name}", "/nonexistent/otel-gil.sock",
                                           env={"OTEL_GIL_BACKEND": "inprocess"}))
    site = f"{venv}/lib/python{version}/site-packages/otel_gil/"
    suffix = next(t.ext_suffix for t in wheels.targets() if t.wheel_name() == wheel.name)
    assert sorted(m for m, f in report["modules"].items() if f.endswith(suffix)) == wheels.extension_modules(True)
    assert all(f.startswith(site) for f in report["modules"].values()), report["modules"]

    where.run(f"{venv}/bin/pip", "download", "-q", "--only-binary", ":all:", "-d", where.wheelhouse, "opentelemetry-distro")
    where.run(f"{venv}/bin/pip", "install", "-q", "--no-index", "--only-binary", ":all:", "--find-links",
              where.wheelhouse, "opentelemetry-distro")
    app = "from opentelemetry import trace\nwith trace.get_tracer('app').start_as_current_span('request'): pass\n"
    with otlp_http_receiver() as (endpoint, bodies):
        done = where.run(f"{venv}/bin/opentelemetry-instrument", f"{venv}/bin/python", "-W", "error::RuntimeWarning",
                         "-c", app, env={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_METRICS_EXPORTER": "none",
                                         "OTEL_LOGS_EXPORTER": "none", "OTEL_GIL_BACKEND": "inprocess"})
    assert "no span is exported" not in done.stderr, done.stderr
    spans = [s for body in bodies for r in ExportTraceServiceRequest.FromString(body).resource_spans
             for scope in r.scope_spans for s in scope.spans]
    assert [s.name for s in spans] == ["request"], spans
    assert {a.key: a.value.string_value for a in spans[0].attributes if a.key.startswith("gil.")} \
        == {"gil.status": "gil_disabled"}, spans[0].attributes


def test_every_x86_64_wheel_is_tested():
    """Each x86_64 wheel make wheels builds is installed by a test above (aarch64: see the README)."""
    tested = set(MATRIX) | set(FREE_THREADED) | {v for machine, vs in TREES.values() if machine == "x86_64" for v in vs}
    built = {t.python for t in wheels.targets() if t.machine == "x86_64"}
    assert built <= tested, built - tested


def test_sdist_without_a_compiler_says_why(trees, place):
    """Where no wheel fits, pip builds the sdist; with no compiler otel-gil installs without its
    C parts, and says so: ``otel-gil check`` names the fix, spans say unsupported_interpreter."""
    where = place(trees("sid-slim"))
    sdist = DIST / wheels.sdist_name()
    assert sdist.exists(), f"{sdist} is missing: run 'make wheels'"
    for source in (sdist, *WORKLOADS):
        shutil.copy2(source, where.host_dir / source.name)
    wheel = built_wheel("3.13", "x86_64")  # its dependencies are the sdist's
    (where.host_dir / "requirements.txt").write_text("\n".join([*requirements(wheel), "setuptools>=77"]) + "\n")
    venv, work = f"{where.dir}/venv", where.dir
    where.run("/usr/bin/python3.13", "-m", "venv", venv)
    where.run(f"{venv}/bin/pip", "download", "-q", "--only-binary", ":all:", "-d", where.wheelhouse,
              "-r", f"{work}/requirements.txt")
    where.run(f"{venv}/bin/pip", "install", "-q", "--no-index", "--find-links", where.wheelhouse, f"{work}/{sdist.name}")
    check = where.run(f"{venv}/bin/otel-gil", "check", "--backend", "inprocess", user=NOBODY, ok=(1,))
    assert "no GIL figures with the inprocess backend (unsupported_interpreter): otel_gil._inprocess was not built" \
        in check.stderr and "where a C compiler and Python.h are present" in check.stderr, check.stderr
    done = where.run(f"{venv}/bin/python", f"{work}/scenarios.py", *HOG, user=NOBODY, env={"OTEL_GIL_BACKEND": "inprocess"})
    report = json.loads(done.stdout)
    assert not set(wheels.extension_modules()) & set(report["modules"]), report["modules"]
    for name in ("victim", "hog"):
        attributes = span(report, name)["attributes"]
        assert attributes.get("gil.status") == "unsupported_interpreter" and "gil.wait_ms" not in attributes, attributes


def test_the_collector_wheel_for_operators(place):
    """An operator's install: otel-gil-collector's wheel with this host's otel-gil wheel,
    offline, into a fresh venv of the system's CPython (bcc is Debian's, a system package),
    used from outside the checkout: `otel-gil report` compiles the BPF program from what the
    wheels installed, and names the hog's code in report_target.py with its hold."""
    where = place(None)
    system = where.run("/usr/bin/python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])").stdout.strip()
    venv = install(where, "/usr/bin/python3", built_wheel(system, "x86_64"), DIST / wheels.collector_wheel_name(),
                   venv_options=("--system-site-packages",))
    found = where.run(f"{venv}/bin/python", "-c", "import otel_gil, otel_gil_collector, bcc; "
                      "print(otel_gil.__file__, otel_gil_collector.__file__)").stdout.split()
    assert len(found) == 2 and all(f.startswith(f"{venv}/lib/python{system}/site-packages/") for f in found), found
    target, _ = start_target(bursts=5)
    try:
        result, truth, progress = report_during_bursts(target, "--duration", "2s", otel_gil=[f"{venv}/bin/otel-gil"],
                                                       env={"PATH": "/usr/bin:/bin", "HOME": "/root"}, cwd=where.dir)
    finally:
        target.kill()
        target.wait()
    check_functions(result, truth)

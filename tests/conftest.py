"""Session fixtures: one real collector per test session, and a sandbox for uid nobody."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from helpers import (BACKENDS, HOG_BURST_MS, HOG_BURSTS, NOBODY, ROOT, Rootfs, Runner, free_threaded_interpreters,
                     interpreters, matrix_names, run_scenario, serving, stack)


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request) -> str:
    """Who writes the GIL slots: every figure test runs once per writer (OTEL_GIL_BACKEND)."""
    return request.param


@pytest.fixture(scope="session")
def collector() -> stack.Service:
    """The real eBPF collector, one per session (needs root: without it this fails, it does not skip)."""
    if os.geteuid() != 0:
        pytest.fail("the collector tests need root (eBPF): run them with sudo, as CI does")
    workdir = Path(tempfile.mkdtemp(prefix="otel-gil-test-"))
    os.chmod(workdir, 0o755)  # the unprivileged test connects as nobody
    sock = str(workdir / "otel-gil.sock")
    try:
        # The usual soft fd limit (1024; the collector raises it to the hard one itself).
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        service = serving(stack.start_collector(sock, workdir / "collector.log", nofile=(min(1024, hard), hard)))
    except stack.StackError as exc:
        pytest.fail(str(exc))
    yield service
    service.proc.terminate()
    try:
        service.proc.wait(20)
    except subprocess.TimeoutExpired:
        service.proc.kill()
        pytest.fail("the collector did not stop on SIGTERM")
    assert service.proc.returncode == 0, service.log_text()
    shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def hog_report(collector, backend) -> dict:
    """The hog scenario (HOG_BURSTS bursts of HOG_BURST_MS ms) with this session's backend: run
    once for the modules that each check part of it (ground truth, blame, metric counters)."""
    return run_scenario("hog", collector.address, "--bursts", str(HOG_BURSTS), "--burst-ms", str(HOG_BURST_MS),
                        backend=backend)


@pytest.fixture(scope="session")
def matrix_runner(collector):
    """name -> Runner for every build of the matrix (helpers.matrix_names): the host's, and
    those of scripts/rootfs.sh's trees, each tree set up on first use and undone at the end."""
    host, trees = interpreters(), {}

    def get(name: str) -> Runner:
        if name in host:
            return host[name]
        tree, version, isolation = name.split("-")
        if tree not in trees:
            trees[tree] = Rootfs(tree, os.path.dirname(collector.address))
        return trees[tree].runner(version, isolation)

    yield get
    for tree in trees.values():
        tree.close()


@pytest.fixture(params=matrix_names(("container",)))
def interpreter(request, matrix_runner) -> Runner:
    """Each build of the verified matrix in turn (README's table), Debian's in a container. In
    a chroot, what a check reads or counts is what it is in the container: whoever attaches from
    outside reads the same files (probes._host_path: a container's through /proc/<pid>/root, a
    chroot's, whose maps paths include the root, through /proc/<pid>/map_files/), the in-process
    hooks see no root, and a chroot's pid namespace is the host builds' own. test_interpreters
    registers every build from a chroot too: that finding of its files."""
    return matrix_runner(request.param)


def _sandbox(pid_namespace: bool):
    """A Runner for uid/gid nobody with no capabilities, in a private mount namespace
    (and a pid namespace, like a container's, if asked). The interpreter, its
    site-packages and this checkout may live under /root: they are bound under a
    directory nobody can read; nothing on the host changes, the binds vanish with
    the workload."""
    workdir = Path(tempfile.mkdtemp(prefix="otel-gil-nobody-"))
    os.chmod(workdir, 0o755)
    binds = {"prefix": sys.base_prefix, "site": sysconfig.get_paths()["purelib"], "repo": str(ROOT),
             "pkgs": str(ROOT / "collector")}
    script = ["set -e"]
    for name, src in binds.items():
        (workdir / name).mkdir(parents=True)
        script.append(f"mount --bind '{src}' '{workdir / name}'")
    script.append(
        f'exec setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups --inh-caps=-all --bounding-set=-all "$@"'
    )
    namespaces = ("--pid", "--fork", "--mount-proc") if pid_namespace else ()
    yield Runner(
        prefix=("unshare", "--mount", "--propagation", "private", *namespaces, "sh", "-c", "\n".join(script), "sandbox"),
        python=str(workdir / "prefix" / "bin" / os.path.basename(os.path.realpath(sys.executable))),
        repo=workdir / "repo",
        env={
            "PYTHONPATH": f"{workdir / 'repo'}:{workdir / 'pkgs'}:{workdir / 'site'}",
            "LD_LIBRARY_PATH": str(workdir / "prefix" / "lib"),
            "PYTHONNOUSERSITE": "1",
            "HOME": "/nonexistent",
        },
    )
    shutil.rmtree(workdir)  # only empty directories: the binds vanished with the workload's namespace


@pytest.fixture
def nobody() -> Runner:
    yield from _sandbox(pid_namespace=False)


@pytest.fixture
def container() -> Runner:
    """nobody, in its own pid and mount namespaces: the collector sees other pids and paths."""
    yield from _sandbox(pid_namespace=True)


@pytest.fixture(scope="module", params=sorted(free_threaded_interpreters()))
def free_threaded(request) -> Runner:
    """Each free-threaded build of the matrix (scripts/freethreaded.sh); a missing one fails."""
    runner = free_threaded_interpreters()[request.param]
    if not Path(runner.python).exists():
        pytest.fail(f"{runner.python} is missing: run 'make matrix' (or 'make test') first")
    return runner

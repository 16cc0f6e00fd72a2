"""The same ground truth on every CPython build we claim (README's table): pyenv
3.9-3.13 with symbols; Debian's python3.11, stripped, LTO+PGO, statically
linked, where drop_gil is inlined into os_stat, _Py_read, ... and take_gil is
found through PyEval_AcquireLock's call; Debian sid's 3.13, 3.14 and 3.15 and
bullseye's 3.9 (glibc 2.31, whose pthread_cond_* live in libpthread.so.0), each
in a container (pivot_root, own pid namespace), and registered with the collector
from a plain chroot (its root in the collector's mount and pid namespaces)."""

import pytest

from helpers import (BACKENDS, check_hog_ground_truth, check_releases_counted, check_tasks_ground_truth, matrix_names,
                     run_scenario)

# Chrooted, a build is registered from files found another way (/proc/<pid>/map_files/: its maps
# paths include the root), and probed as in its container; the in-process hooks see no root at all.
HOG_CASES = [(b, name) for b in BACKENDS for name in matrix_names(("container",))] + [
    ("collector", name) for name in matrix_names() if name.endswith("-chroot")]
# Whose code ran on a loop does not depend on where the files are: each build once, in its container.
TASK_CASES = [(b, name) for b in BACKENDS for name in matrix_names(("container",))]


@pytest.mark.parametrize("backend, interpreter", HOG_CASES, indirect=["interpreter"])
def test_hog_ground_truth(collector, backend, interpreter):
    check_hog_ground_truth(run_scenario("hog", collector.address, "--bursts", "5", "--burst-ms", "100",
                                        runner=interpreter, backend=backend))


def test_inlined_releases_are_counted(collector, backend, interpreter):
    """os.stat/os.read release the GIL through whatever copy of drop_gil the build has."""
    check_releases_counted(run_scenario("syscalls", collector.address, "--iterations", "500", runner=interpreter,
                                        backend=backend))


@pytest.mark.parametrize("backend, interpreter", TASK_CASES, indirect=["interpreter"])
def test_each_task_gets_its_own_figures(collector, backend, interpreter):
    """Requests as asyncio tasks sharing the loop thread: their own code's hold (pieces, a PyDLL
    hold, gather children, a to_thread worker), the loop's waits on a hog, and blame naming the
    request the loop ran. Switches are seen through Context.run (3.9-3.13) or the context
    watcher (3.14+)."""
    check_tasks_ground_truth(run_scenario("tasks", collector.address, runner=interpreter, backend=backend))


@pytest.mark.parametrize("backend, interpreter", TASK_CASES, indirect=["interpreter"])
def test_each_task_on_uvloop_gets_its_own_figures(collector, backend, interpreter):
    """The same requests on uvloop's loop (a wheel for every build), which enters its tasks'
    contexts in C: seen through its GOT entries of PyContext_Enter/Exit (3.9-3.13, hooked when
    the loop is first seen) or the context watcher (3.14+)."""
    report = run_scenario("tasks", collector.address, "--loop", "uvloop", runner=interpreter, backend=backend)
    truth = report["truth"]
    assert truth.get("uvloop"), "the requests did not run on uvloop"
    # one hook per switch: uvloop's GOT before 3.14, the watcher alone since
    assert truth["uvloop_hooked"] == (tuple(truth["python"]) < (3, 14)), truth["uvloop_hooked"]
    check_tasks_ground_truth(report)

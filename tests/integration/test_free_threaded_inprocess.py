"""``otel_gil._inprocess`` on a free-threaded build, where its calls from Python run one at a
time under a lock of its own (api_lock): a fork while ``install()`` holds it, in the window where
``learn_conds`` lets the GIL go, leaves a child whose own calls still run."""

from __future__ import annotations

import os
import subprocess

import pytest

from helpers import ROOT, free_threaded_interpreters

IN_INSTALL = 3  # forks inside install() to see; each process makes one fork, inside it or not
ATTEMPTS = 40
# One fork per process: the first install() learns the GIL's conds by letting the GIL go, which
# the forker, spinning (it asked for the GIL meanwhile), takes and forks with.
_FORKING = """if True:
    import os, signal, sys, threading, time, warnings
    from otel_gil import _inprocess
    warnings.simplefilter("ignore", DeprecationWarning)  # fork() of a process with threads: that is the point
    sys.setswitchinterval(0.005)  # the forker asks for the GIL after 5 ms, and runs 5 ms before it is asked back
    go, done, seen = [False], [False], []

    def forker() -> None:
        while not go[0]:
            pass
        during = not done[0]; pid = os.fork()  # (no eval-breaker check between) install() had not returned:
        if pid == 0:                              # it let the GIL go inside, as it does only there
            signal.alarm(2)  # a child stuck on the lock dies of SIGALRM
            _inprocess.uninstall()
            os._exit(0)
        seen.append((os.WIFSIGNALED(os.waitpid(pid, 0)[1]), during))

    thread = threading.Thread(target=forker)
    thread.start()
    time.sleep(0.01)
    # No eval-breaker check between these (a store, a bytes repeat: no call), so the GIL stays
    # here until learn_conds lets it go; the repeat's tens of ms let the forker ask for it first.
    go[0] = True; pad = b"\\0" * 50_000_000; _inprocess.install(64, 1_000_000, 5_000_000); done[0] = True
    thread.join()
    _inprocess.uninstall()
    print(*seen[0])
"""


def test_a_fork_while_install_holds_its_lock_leaves_a_child_that_can_uninstall():
    python = free_threaded_interpreters()["cpython-3.13t"].python
    if not os.path.exists(python):
        pytest.fail(f"{python} is missing: run 'make matrix' (or 'make test') first")
    runs = []
    while sum(during for _, during in runs) < IN_INSTALL and len(runs) < ATTEMPTS:
        done = subprocess.run([python, "-c", _FORKING], capture_output=True, text=True, timeout=60,
                              env={"PYTHONPATH": str(ROOT), "PYTHON_GIL": "1"}, cwd=ROOT)
        assert done.returncode == 0, done.stderr
        runs.append(tuple(word == "True" for word in done.stdout.split()))
    assert sum(during for _, during in runs) >= IN_INSTALL, runs  # the window was hit
    assert not any(hung for hung, _ in runs), runs  # (hung, during install)

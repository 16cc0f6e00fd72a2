"""Free-threaded builds (scripts/freethreaded.sh's 3.13t): otel_gil never turns the GIL on.

Importing otel_gil, ``instrument()``, spans, metrics, ``otel-gil check`` and ``uninstrument()``
under ``-W error::RuntimeWarning`` (an extension that turns the GIL on warns), with either
backend: helpers.check_free_threaded. The collector, asked to probe such a process directly,
says ``gil_disabled`` too."""

from __future__ import annotations

import os
import subprocess

import pytest

from helpers import BACKENDS, FREE_THREADED_WORKLOAD, check_free_threaded, free_threaded_interpreters

BUILDS = free_threaded_interpreters()


def python_of(name: str) -> str:
    python = BUILDS[name].python
    if not os.path.exists(python):  # make matrix (a prerequisite of make test) builds it: fail, as the siblings do
        pytest.fail(f"{python} is missing: run 'make matrix' (or 'make test') first")
    return python


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("build", BUILDS)
def test_gil_stays_off_and_spans_say_so(collector, build, backend):
    env = {**os.environ, **BUILDS[build].env, "OTEL_GIL_BACKEND": backend}
    done = subprocess.run([python_of(build), "-W", "error::RuntimeWarning", str(FREE_THREADED_WORKLOAD),
                           collector.address], capture_output=True, text=True, timeout=60, env=env)
    report = check_free_threaded(done)
    assert all(f.startswith(str(BUILDS[build].repo)) for f in report["modules"].values()), report["modules"]


@pytest.mark.parametrize("build", BUILDS)
def test_collector_says_gil_disabled(build):
    """The collector's own probe planning, on a live free-threaded process (its GIL off)."""
    from otel_gil import protocol
    from otel_gil_collector import probes

    proc = subprocess.Popen([python_of(build), "-c", "import sys; print(sys._is_gil_enabled(), flush=True); "
                             "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "False"
        with pytest.raises(probes.UnsupportedProcess) as refused:
            probes.plan(proc.pid)
        assert refused.value.code == protocol.GIL_DISABLED, refused.value
    finally:
        proc.communicate("")


# install()/uninstall() from 8 threads at once, with no GIL to take turns: they take turns on
# _inprocess's own lock, so every GOT entry is restored in the end. (With the GIL off install()
# finds no GIL to learn and raises Unsupported after patching.)
_CONCURRENT_INSTALLS = """
import sys, threading
from otel_gil import _inprocess

def cycles():
    for _ in range(20):
        try:
            _inprocess.install(2048, 1_000_000, 5_000_000)
        except _inprocess.Unsupported:
            pass
        _inprocess.uninstall()

threads = [threading.Thread(target=cycles) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
entries = _inprocess.got_entries()
print(sys._is_gil_enabled(), len(entries), all(e["value"] == e["original"] for e in entries))
"""


@pytest.mark.parametrize("build", BUILDS)
def test_concurrent_installs_restore_every_got_entry(build):
    done = subprocess.run([python_of(build), "-W", "error::RuntimeWarning", "-c", _CONCURRENT_INSTALLS],
                          capture_output=True, text=True, timeout=60, env={**os.environ, **BUILDS[build].env})
    assert done.returncode == 0, done.stderr
    gil_enabled, entries, restored = done.stdout.split()
    assert (gil_enabled, restored) == ("False", "True") and int(entries) >= 2, done.stdout

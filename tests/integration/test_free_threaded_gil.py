"""A free-threaded build (3.13t) whose GIL is on, on both backends: from the start
(``PYTHON_GIL=1``), the ground truth of default builds, code locations included; turned on
mid-run by an import in a request handler (a real HTTP server), spans in flight across it
say so and name the module, and spans after it carry exact figures."""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import threading
from pathlib import Path

import pytest

from helpers import (ROOT, Runner, check_hog_ground_truth, check_releases_counted, run_scenario,
                     span, within)

IMPORT_COST = ROOT / "tests" / "workloads" / "import_cost.py"
LEGACY = "legacy_ext"  # declares nothing about the GIL: importing it turns a free-threaded build's GIL on
SLOW = ("slow_ext_300", "slow_ext_600")  # declare they need no GIL; their inits sleep 300 and 600 ms
_EXTENSION_C = """#include <Python.h>
#include <unistd.h>
static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "%(name)s", NULL, -1, NULL};
PyMODINIT_FUNC PyInit_%(name)s(void)
{
    PyObject *m = PyModule_Create(&def);
    if (m != NULL && %(sleep_ms)d) {
        if (PyUnstable_Module_SetGIL(m, Py_MOD_GIL_NOT_USED) < 0)
            return NULL;
        Py_BEGIN_ALLOW_THREADS  /* with the GIL CPython turned on to run this init */
        usleep(%(sleep_ms)d * 1000);
        Py_END_ALLOW_THREADS
    }
    return m;
}
"""


@pytest.fixture(scope="module")
def legacy_dir(free_threaded, tmp_path_factory) -> Path:
    """A directory holding LEGACY and SLOW, compiled for the free-threaded build with cc."""
    where = tmp_path_factory.mktemp("legacy")
    include, suffix = subprocess.run(
        [free_threaded.python, "-c", "import sysconfig; print(sysconfig.get_paths()['include'], "
         "sysconfig.get_config_var('EXT_SUFFIX'))"], capture_output=True, text=True, check=True).stdout.split()
    for name, sleep_ms in ((LEGACY, 0), *((name, int(name.rsplit("_", 1)[1])) for name in SLOW)):
        (where / f"{name}.c").write_text(_EXTENSION_C % {"name": name, "sleep_ms": sleep_ms})
        subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror", f"-I{include}", "-o",
                        str(where / f"{name}{suffix}"), str(where / f"{name}.c")], check=True)
    return where


def test_gil_on_from_the_start(collector, backend, free_threaded):
    """PYTHON_GIL=1: the hog's hold, the victim's wait, blame and the blocker's code, exact; the
    gil.enabled gauge says the GIL is on, and names no module."""
    runner = Runner(free_threaded.python, env={**free_threaded.env, "PYTHON_GIL": "1"})
    report = run_scenario("hog", collector.address, "--bursts", "5", "--burst-ms", "100", runner=runner, backend=backend)
    assert report["backend"] == backend
    assert report["truth"]["metrics_alive"]["gil.enabled"] == {"": 1}
    check_hog_ground_truth(report)


def test_every_release_is_counted_with_the_gil_on_from_the_start(collector, backend, free_threaded):
    """PYTHON_GIL=1: os.stat/os.read release and retake the GIL, each counted, holds as measured."""
    runner = Runner(free_threaded.python, env={**free_threaded.env, "PYTHON_GIL": "1"})
    check_releases_counted(run_scenario("syscalls", collector.address, "--iterations", "500", runner=runner,
                                        backend=backend))


def test_an_import_in_a_request_turns_the_gil_on(collector, backend, free_threaded, legacy_dir):
    runner = Runner(free_threaded.python, env={"PYTHONPATH": f"{ROOT}:{legacy_dir}"})
    report = run_scenario("turned_on", collector.address, "--legacy", LEGACY, "--bursts", "5", "--burst-ms", "100",
                          runner=runner, backend=backend)
    truth = report["truth"]
    assert (truth["gil_at_start"], truth["gil_after_import"], truth["measuring"]) == (False, True, True), report["stderr"]
    assert report["backend"] == backend
    assert span(report, "before")["attributes"]["gil.status"] == "gil_disabled"
    # In flight across the import, on its thread and on another: a status and the module, no figure.
    for name in ("GET /import", "in flight"):
        crossed = span(report, name)
        gil = {k: v for k, v in crossed["attributes"].items() if k.startswith("gil.")}
        assert gil == {"gil.status": "gil_turned_on"}, crossed
        [event] = [e for e in crossed["events"] if e["name"] != "cpython.park"]  # parks while the GIL was off
        assert (event["name"], event["attributes"]) == ("gil.enabled", {"gil.enabled_by": LEGACY}), crossed
        assert all(e["timestamp"] <= event["timestamp"] for e in crossed["events"] if e["name"] == "cpython.park"), crossed
        assert truth["import_started_ns"] <= event["timestamp"] <= truth["import_ended_ns"], (event, truth)
    said = [line for line in report["stderr"].splitlines() if f"importing {LEGACY} (" in line]
    assert len(said) == 1 and "turned the GIL of this free-threaded build on" in said[0], report["stderr"]
    assert truth["gauge"] == {"start": [], "after": [[1, {"gil.enabled_by": LEGACY}]]}, truth["gauge"]
    # After it: a request's PyDLL hold, and the hog scenario's ground truth.
    held = span(report, "GET /hold")["attributes"]
    assert "gil.status" not in held and within(held["gil.hold_ms"], truth["request_hold_ns"] / 1e6), held
    check_hog_ground_truth(report)


def test_another_imports_gil_is_not_taken_for_good(free_threaded, legacy_dir):
    """CPython turns the GIL on for each single-phase module's init and off after it: an import
    that ends while another thread's init still has it on (``sys._is_gil_enabled()`` true then)
    did not turn it on for good, which the GIL's own count (through ``_Py_DebugOffsets``) says.
    No backend starts, nothing is logged, spans say ``gil_disabled``. (No collector: nothing
    registers.)"""
    runner = Runner(free_threaded.python, env={"PYTHONPATH": f"{ROOT}:{legacy_dir}"})
    report = run_scenario("transient", "/nonexistent", "--legacy", ",".join(SLOW), runner=runner, backend="auto")
    truth = report["truth"]
    first, second = SLOW
    assert (truth[f"gil_after_{first}"], truth[f"gil_after_{second}"], truth["gil_at_end"]) == (True, False, False)
    assert "otel-gil: importing" not in report["stderr"], report["stderr"]
    for name in SLOW:
        assert span(report, f"import {name}")["attributes"]["gil.status"] == "gil_disabled"


def test_the_import_that_turns_the_gil_on_pays_at_most_a_millisecond_more(free_threaded, legacy_dir, tmp_path):
    """The import records the switch; registration (here with a collector that accepts and never
    answers, 2 s of timeout, then in-process) and the GOT hooks are for otel-gil's own thread. Each run its own
    process (the GIL turns on once), instrumented and bare in turns, the medians compared."""
    path = str(tmp_path / "silent.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)  # as the collector listens
    listener.bind(path)
    listener.listen(16)
    accepted = []

    def accept() -> None:
        try:
            while True:
                accepted.append(listener.accept()[0])
        except OSError:  # closed
            pass

    threading.Thread(target=accept, daemon=True).start()
    env = {**free_threaded.env, "PYTHONPATH": f"{ROOT}:{legacy_dir}"}
    took: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(7):
        for bare in (True, False):
            done = subprocess.run([free_threaded.python, str(IMPORT_COST), LEGACY, path, *(["--bare"] if bare else [])],
                                  capture_output=True, text=True, env=env, timeout=60)
            assert done.returncode == 0, done.stderr
            run = json.loads(done.stdout)
            assert run["gil_after"] and (bare or run["measuring"] in ("collector", "inprocess")), run
            took[bare].append(run["import_ns"] / 1e6)
    listener.close()
    assert accepted, "otel-gil never connected to the silent collector"
    for conn in accepted:
        conn.close()
    bare, ours = statistics.median(took[True]), statistics.median(took[False])
    assert ours <= bare + 1.0, (took, ours, bare)


_CREATE_DYNAMIC = """if True:
    import _imp, importlib.util, json, sys
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from otel_gil import GilInstrumentor
    exporter, provider = InMemorySpanExporter(), TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    GilInstrumentor().instrument(tracer_provider=provider, backend="inprocess")
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("off"):
        pass
    _imp.create_dynamic(importlib.util.find_spec(sys.argv[1]))  # no loader: no import otel-gil watches
    with tracer.start_as_current_span("seen"):
        pass
    started = GilInstrumentor._backend.wait(20)
    with tracer.start_as_current_span("measured"):
        pass
    print(json.dumps([started, sys._is_gil_enabled(), {s.name: dict(s.attributes) for s in exporter.get_finished_spans()}]))
"""


def test_a_gil_turned_on_without_an_import_is_seen_at_the_next_span(free_threaded, legacy_dir):
    """``_imp.create_dynamic`` called directly (a loader of its own): no import otel-gil watches
    turned the GIL on; the next span start sees it on for good and the backend starts."""
    done = subprocess.run([free_threaded.python, "-c", _CREATE_DYNAMIC, LEGACY], capture_output=True, text=True,
                          env={**free_threaded.env, "PYTHONPATH": f"{ROOT}:{legacy_dir}"}, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    started, gil_on, spans = json.loads(done.stdout)
    assert started and gil_on, done.stderr
    assert (spans["off"]["gil.status"], spans["seen"]["gil.status"]) == ("gil_disabled", "pending"), spans
    assert "gil.status" not in spans["measured"] and "gil.hold_ms" in spans["measured"], spans
    assert "something other than an extension import otel-gil watches" in done.stderr, done.stderr

"""Thread names read from a process's memory (collector/otel_gil_collector/threadnames.py): /proc's
names, with a note, when the memory cannot be read, and no names through offsets the build
contradicts. The table's offsets against each interpreter's headers: test_pystructs;
`report` naming every matrix build's threads: test_report."""

import json
import os
import signal
import subprocess
import sys
from dataclasses import replace

import pytest

from helpers import ROOT, free_threaded_interpreters
from otel_gil import pystructs
from otel_gil_collector import probes, report, threadnames


def test_report_falls_back_to_proc_names_with_a_note(monkeypatch):
    """A version without a row: /proc's names (the executable's name, before 3.14), and why."""
    monkeypatch.delitem(pystructs.STRUCTS, sys.version_info[:2])
    target = subprocess.Popen([sys.executable, str(ROOT / "tests" / "workloads" / "report_target.py")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert target.stdout.readline().startswith("ready")

        def progress(message: str) -> None:  # its bursts, once attached: GIL hand-offs to capture
            if message.startswith("capturing"):
                target.send_signal(signal.SIGUSR1)

        captured = report.capture(target.pid, 1.0, progress=progress)
        comm = {int(tid): open(f"/proc/{target.pid}/task/{tid}/comm").read().strip()
                for tid in os.listdir(f"/proc/{target.pid}/task")}
    finally:
        target.kill()
        target.wait()
    result = captured.report
    assert result["thread_names"].startswith("/proc (") and "no struct layout" in result["thread_names"], result
    assert f"thread names from {result['thread_names']}" in report.render(result)
    assert {t["tid"]: t["name"] for t in result["threads"]}.items() <= comm.items()


def test_a_table_row_the_build_contradicts_is_refused(monkeypatch):
    """3.13+: the build's own _Py_DebugOffsets must agree with the table (another configuration
    moves the structs): no names read through wrong offsets."""
    python = ROOT / ".venv-matrix" / "3.13" / "bin" / "python"
    target = subprocess.Popen([str(python), "-c", "import threading, sys; print(1, flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert target.stdout.readline().strip() == "1"
        plan = probes.plan(target.pid)
        assert "MainThread" in threadnames.read(target.pid, plan.interpreter, plan.interpreter_file).values()
        row = pystructs.STRUCTS[(3, 13)]
        monkeypatch.setitem(pystructs.STRUCTS, (3, 13), replace(row, interpreters_head=row.interpreters_head + 8))
        with pytest.raises(threadnames.Unreadable, match="_Py_DebugOffsets put interpreters_head at 632, the table at 640"):
            threadnames.read(target.pid, plan.interpreter, plan.interpreter_file)
    finally:
        target.kill()
        target.wait()


_NAMED_THREADS = """if True:
    import json, sys, threading
    release = threading.Event()
    threads = [threading.Thread(target=release.wait, name=name) for name in ("worker", "a-name-longer-than-15-chars")]
    for t in threads:
        t.start()
    print(json.dumps({t.native_id: t.name for t in threads}), sys._is_gil_enabled(), flush=True)
    sys.stdin.read()
    release.set()
"""


@pytest.mark.parametrize("gil", ["0", "1"])
def test_a_free_threaded_builds_thread_names_are_read_through_its_row(gil):
    """A free-threaded build (its objects' header is 32 bytes: ob_type at 24), GIL off or on: the
    names threading gives, read through the build's own row, as its ring's layout is."""
    python = free_threaded_interpreters()["cpython-3.13t"].python
    if not os.path.exists(python):
        pytest.fail(f"{python} is missing: run 'make matrix' (or 'make test') first")
    target = subprocess.Popen([python, "-c", _NAMED_THREADS], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env={"PYTHON_GIL": gil})
    try:
        names, enabled = target.stdout.readline().rsplit(" ", 1)
        assert enabled.strip() == {"0": "False", "1": "True"}[gil]
        [lib] = {m.path for m in probes.mapped_files(target.pid) if "libpython3.13t.so" in m.path}
        read = threadnames.read(target.pid, lib, lib)
    finally:
        target.kill()
        target.wait()
    assert {int(tid): name for tid, name in json.loads(names).items()}.items() <= read.items(), read
    assert "MainThread" in read.values(), read

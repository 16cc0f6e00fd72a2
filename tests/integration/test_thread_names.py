"""Thread names read from a process's memory (collector/otel_gil_collector/threadnames.py): the struct offsets
of its table against each interpreter's own headers, and /proc's names, with a note, when
the memory cannot be read. `report` naming every matrix build's threads is in test_report."""

import os
import signal
import subprocess
import sys
from dataclasses import replace

import pytest

from helpers import ROOT, matrix_names
from otel_gil_collector import probes, report, threadnames

# offsetof/sizeof of what LAYOUTS holds, compiled against the interpreter's headers.
_LAYOUT_C = r"""
#define Py_BUILD_CORE 1
#include <Python.h>
#include <internal/pycore_runtime.h>
#include <internal/pycore_interp.h>
#include <stddef.h>
#include <stdio.h>
int main(void) {
    printf("%d %d %zu %zu %zu %zu %zu\n", PY_MAJOR_VERSION, PY_MINOR_VERSION,
           offsetof(_PyRuntimeState, interpreters.head),
#if PY_VERSION_HEX >= 0x030C0000
           offsetof(PyInterpreterState, imports.modules),
#else
           offsetof(PyInterpreterState, modules),
#endif
           offsetof(PyHeapTypeObject, ht_cached_keys), sizeof(PyASCIIObject), sizeof(PyCompactUnicodeObject));
    return 0;
}
"""
_COMPILE = """set -e
include=$("$0" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
out=$(mktemp)
gcc -w -x c -I"$include" -I"$include/internal" -o "$out" -
"$out"
rm -f "$out"
"""
BUILDS = [name for name in matrix_names() if not name.endswith("-container")]  # containers share the files


@pytest.mark.parametrize("name", BUILDS)
def test_layout_table_matches_the_headers(matrix_runner, name):
    runner = matrix_runner(name)
    done = subprocess.run([*runner.prefix, "sh", "-c", _COMPILE, runner.python], input=_LAYOUT_C,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"compiling against {name}'s headers failed (python3.X-dev?):\n{done.stderr}"
    major, minor, *offsets = map(int, done.stdout.split())
    assert threadnames.LAYOUTS[(major, minor)] == threadnames.Layout(*offsets)


def test_report_falls_back_to_proc_names_with_a_note(monkeypatch):
    """A version without a row: /proc's names (the executable's name, before 3.14), and why."""
    version = sys.version_info[:2]
    monkeypatch.setitem(threadnames.LAYOUTS, version, replace(threadnames.LAYOUTS[version], interpreters_head=0))
    target = subprocess.Popen([sys.executable, str(ROOT / "tests" / "workloads" / "report_target.py")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert target.stdout.readline().startswith("ready")
        target.send_signal(signal.SIGUSR1)  # its bursts: GIL hand-offs to capture
        captured = report.capture(target.pid, 1.0, progress=lambda message: None)
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
        row = threadnames.LAYOUTS[(3, 13)]
        monkeypatch.setitem(threadnames.LAYOUTS, (3, 13), replace(row, interpreters_head=row.interpreters_head + 8))
        with pytest.raises(threadnames.Unreadable, match="_Py_DebugOffsets put interpreters.head at 632"):
            threadnames.read(target.pid, plan.interpreter, plan.interpreter_file)
    finally:
        target.kill()
        target.wait()

"""Apps register whatever their root, beyond the matrix's containers and chroots
(test_interpreters): a tree bound at a path that exists only in the app's own mount
namespace, and an interpreter file deleted and replaced while it runs. In both the
collector cannot open the file by the name /proc/<pid>/maps gives; it opens the
mapped file itself through /proc/<pid>/map_files/."""

import json
import os
import shutil
import subprocess
import sysconfig

from helpers import ROOT, SCENARIOS, check_hog_ground_truth, run_scenario

HOG = ("hog", "--bursts", "5", "--burst-ms", "100")
# Replaces the running interpreter's file (a package upgrade does this), then runs argv[1:].
REPLACE_THEN_RUN = """import os, runpy, shutil, sys
shutil.copy2(sys.executable, sys.executable + ".new")
os.replace(sys.executable + ".new", sys.executable)
assert os.readlink("/proc/self/exe").endswith(" (deleted)")
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(sys.argv[0]))  # as 'python script.py' does
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_tree_bound_in_a_private_mount_namespace(collector, matrix_runner):
    runner = matrix_runner("sid-3.14-bind")
    check_hog_ground_truth(run_scenario(HOG[0], collector.address, *HOG[1:], runner=runner))


def test_interpreter_replaced_on_disk(collector, tmp_path):
    python = tmp_path / "python3.11"
    shutil.copy2("/usr/bin/python3.11", python)  # Debian's: static, stripped, LTO
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{sysconfig.get_paths()['purelib']}"}
    done = subprocess.run([str(python), "-c", REPLACE_THEN_RUN, str(SCENARIOS), HOG[0], collector.address, *HOG[1:]],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    report["stderr"] = done.stderr
    check_hog_ground_truth(report)

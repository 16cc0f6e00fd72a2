"""An app that reaches the collector's socket through a read-only mount of its directory (a Pod's
readOnly hostPath volume: deploy/kubernetes/app-pod.yaml) registers and gets the collector's
figures: connecting to a Unix socket writes nothing to its filesystem."""

import sys

from helpers import HOG_BURST_MS, HOG_BURSTS, Runner, check_hog_ground_truth, run_scenario


def test_registers_through_a_read_only_mount(collector, tmp_path):
    directory = collector.address.rsplit("/", 1)[0]
    mount = tmp_path / "run-otel-gil"
    mount.mkdir()
    script = (f"mount --bind '{directory}' '{mount}' && mount -o remount,bind,ro '{mount}' && "
              f"! touch '{mount}/written' 2>/dev/null && exec \"$@\"")  # read-only, or the runner fails
    runner = Runner(sys.executable, prefix=("unshare", "--mount", "--propagation", "private", "sh", "-c", script, "ro"))
    report = run_scenario("hog", str(mount / "otel-gil.sock"), "--bursts", str(HOG_BURSTS), "--burst-ms",
                          str(HOG_BURST_MS), runner=runner)
    check_hog_ground_truth(report)

"""An app without any privilege (uid nobody, no capabilities) registers, maps its
ring read-only and gets the same figures as a root one; or, with no collector at
all, traces itself in-process."""

from helpers import run_scenario, span, within


def test_nobody_gets_figures(collector, nobody):
    report = run_scenario("hog", collector.address, "--bursts", "5", "--burst-ms", "100", runner=nobody)
    assert report["uid"] == 65534
    victim = span(report, "victim")["attributes"]
    assert "gil.status" not in victim, report["stderr"]
    assert within(victim["gil.wait_ms"], report["truth"]["victim_wait_ns"] / 1e6), victim
    assert f"pid {report['pid']} (uid 65534) registered" in collector.log_text()


def test_nobody_without_a_collector_traces_itself(nobody, tmp_path):
    """No root, no capabilities, no collector (auto finds none): the in-process hooks give the figures."""
    report = run_scenario("hog", str(tmp_path / "absent.sock"), "--bursts", "5", "--burst-ms", "100", runner=nobody,
                          backend="auto")
    assert report["uid"] == 65534 and report["backend"] == "inprocess", report["stderr"]
    victim, hog = span(report, "victim")["attributes"], span(report, "hog")["attributes"]
    assert "gil.status" not in victim, report["stderr"]
    assert within(victim["gil.wait_ms"], report["truth"]["victim_wait_ns"] / 1e6), victim
    assert within(hog["gil.hold_ms"], sum(report["truth"]["bursts_ns"]) / 1e6), hog
    assert "no GIL figures" not in report["stderr"]


def test_container_pid_and_mount_namespaces(collector, container, backend):
    """The app sees itself as a low pid in its own namespace and its interpreter at a path
    that exists only there: identity comes from SO_PEERCRED, files from /proc/<pid>/root
    (collector); thread ids are the container's either way."""
    report = run_scenario("hog", collector.address, "--bursts", "5", "--burst-ms", "100", runner=container,
                          backend=backend)
    assert report["pid"] < 10  # as the app sees itself
    victim = span(report, "victim")["attributes"]
    assert "gil.status" not in victim, report["stderr"]
    assert within(victim["gil.wait_ms"], report["truth"]["victim_wait_ns"] / 1e6), victim
    blockers = [e["attributes"]["gil.blocker.thread.native_id"] for e in span(report, "victim")["events"]]
    assert blockers and max(blockers) < 10 + 5, blockers  # the container's tids: main, victim, hog, ...
    if backend == "collector":
        host_pid = report["pid_seen_by_collector"]
        assert host_pid != report["pid"]
        assert f"pid {host_pid} (uid 65534) registered: {container.repo.parent}/prefix/lib/" in collector.log_text()

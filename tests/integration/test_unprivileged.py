"""An app without any privilege (uid nobody, no capabilities) registers, maps its
ring read-only and gets the same figures as a root one."""

from helpers import run_scenario, span, within


def test_nobody_gets_figures(collector, nobody):
    report = run_scenario("hog", collector.address, "--bursts", "5", "--burst-ms", "40", sandbox=nobody)
    assert report["uid"] == 65534
    victim = span(report, "victim")["attributes"]
    assert "gil.status" not in victim, report["stderr"]
    assert within(victim["gil.wait_ms"], report["truth"]["victim_wait_ns"] / 1e6), victim
    assert f"pid {report['pid']} (uid 65534) registered" in collector.log_text()

"""Without a collector: auto traces in-process; a process told to use the collector
runs untouched, with one warning and gil.status, never a made-up figure."""

from helpers import run_scenario, span


def test_collector_backend_says_why_there_are_no_figures(tmp_path):
    report = run_scenario("hog", str(tmp_path / "absent.sock"), "--bursts", "2", "--burst-ms", "5", backend="collector")
    for name in ("victim", "hog"):
        attrs = span(report, name)["attributes"]
        assert attrs["gil.status"] == "no_collector"
        assert not [k for k in attrs if k.startswith("gil.") and k != "gil.status"], attrs
        assert attrs["thread.name"]
    warnings = [line for line in report["stderr"].splitlines() if "no GIL figures" in line]
    assert len(warnings) == 1, report["stderr"]
    assert "absent.sock" in warnings[0]


def test_auto_without_a_collector_traces_in_process(tmp_path):
    report = run_scenario("hog", str(tmp_path / "absent.sock"), "--bursts", "2", "--burst-ms", "20", backend="auto")
    assert report["backend"] == "inprocess"
    hog = span(report, "hog")["attributes"]
    assert "gil.status" not in hog and hog["gil.hold_ms"] >= 40, hog
    assert "no GIL figures" not in report["stderr"], report["stderr"]


def test_auto_with_a_collector_uses_it(collector):
    report = run_scenario("hog", collector.address, "--bursts", "2", "--burst-ms", "20", backend="auto")
    assert report["backend"] == "collector"
    assert f"pid {report['pid']} (uid 0) registered" in collector.log_text()

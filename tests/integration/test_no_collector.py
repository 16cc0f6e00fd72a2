"""Without a collector the app runs untouched: one warning, gil.status, no figures."""

from helpers import run_scenario, span


def test_spans_say_why_there_are_no_figures(tmp_path):
    report = run_scenario("hog", str(tmp_path / "absent.sock"), "--bursts", "2", "--burst-ms", "5")
    for name in ("victim", "hog"):
        attrs = span(report, name)["attributes"]
        assert attrs["gil.status"] == "no_collector"
        assert not [k for k in attrs if k.startswith("gil.") and k != "gil.status"], attrs
        assert attrs["thread.name"]
    warnings = [line for line in report["stderr"].splitlines() if "no GIL figures" in line]
    assert len(warnings) == 1, report["stderr"]
    assert "absent.sock" in warnings[0]

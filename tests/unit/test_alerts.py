"""The alert rules, checked and unit-tested by promtool (built once from Prometheus'
Go module by scripts/promtool.sh, cached outside the repo)."""

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "examples" / "alerts"


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(ROOT / "scripts" / "promtool.sh"), *args], capture_output=True, text=True,
                          cwd=ALERTS, timeout=1200)


def test_rules_are_valid():
    done = promtool("check", "rules", "gil-rules.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 8 rules found" in done.stdout


def test_rules_fire_on_contention_and_stay_quiet_without():
    done = promtool("test", "rules", "gil-rules.test.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_a_wrong_expectation_fails(tmp_path):
    """promtool really evaluates: flipping an expectation makes the test fail."""
    broken = (ALERTS / "gil-rules.test.yml").read_text().replace("value: 0.8", "value: 0.3")
    (tmp_path / "gil-rules.yml").write_text((ALERTS / "gil-rules.yml").read_text())
    (tmp_path / "t.yml").write_text(broken)
    done = subprocess.run([str(ROOT / "scripts" / "promtool.sh"), "test", "rules", "t.yml"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=1200)
    assert done.returncode != 0

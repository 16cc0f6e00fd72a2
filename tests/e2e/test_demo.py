"""The README's first command, shortened: its table must show GIL figures from Jaeger."""

import re
import subprocess
import sys

from helpers import ROOT, stack

ROW = re.compile(r"^GET /\w+\s+([\d.]+)ms\s+([\d.]+)ms\s+([\d.]+)ms\s+([\d.]+)%\s+(.*)$")
WAIT = re.compile(r"^  \+\s*[\d.]+ms  waited\s+[\d.]+ms: (\S+) held it [\d.]+ms in (\S+) \(workload\.py:\d+\)$")
HOG_CODE = ("compute_stats", "_metrics_collector")  # examples/workload.py: where a forced switch finds the hog
# The async example's table: duration, own hold, the loop's hold for the others, wait, wait %.
ASYNC_ROW = re.compile(r"^GET /(\w+)\s+([\d.]+)ms\s+([\d.]+)ms\s+([\d.]+)ms\s+([\d.]+)ms\s+([\d.]+)%$")


def test_demo_prints_the_slowest_spans(jaeger):
    """The demo reuses the session's Jaeger (it would start one otherwise) and runs its own collector."""
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "demo.py"), "--short"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [ROW.match(line) for line in done.stdout.splitlines()]
    rows = [m for m in rows if m]
    assert len(rows) == 10, done.stdout
    for m in rows:
        duration, wait, hold, pct = (float(g) for g in m.groups()[:4])
        assert wait + hold <= duration * 1.01, m.group(0)
    assert any(m.group(5).startswith("metrics-collector ") for m in rows), done.stdout  # the hog first
    assert max(float(m.group(4)) for m in rows) > 30, done.stdout
    waits = [WAIT.match(line) for line in done.stdout.split("the slowest span's waits", 1)[1].splitlines()[1:]]
    waits = [m for m in waits if m]
    assert waits and any(m.group(1) == "metrics-collector" and m.group(2) in HOG_CODE for m in waits), done.stdout
    if stack.jaeger_serves_ui():  # (the session's Jaeger: its release's UI, or the UI build beside the checkout)
        assert re.search(r"slowest trace in Jaeger's UI: http://\S+/trace/[0-9a-f]{32}$", done.stdout, re.M), done.stdout
    else:  # the trace's JSON, and why there is no UI
        why = stack.jaeger_ui().detail
        assert re.search(rf"no Jaeger UI to show it in \({re.escape(why)}\): the slowest trace's JSON is at "
                         rf"{re.escape(stack.JAEGER_QUERY)}/api/traces/[0-9a-f]{{32}}$", done.stdout, re.M), done.stdout
    assert re.search(r"GilContention (inactive|pending|firing); its rule's 5-minute wait ratio is [\d.]+ ",
                     done.stdout), done.stdout
    # The async example: 20 requests in flight on one loop; a request's own hold is its code's, the
    # loop's hold for the others beside it (an /io request's own code is a few awaits).
    rows = [m for m in map(ASYNC_ROW.match, done.stdout.split("on one event loop", 1)[1].splitlines()) if m]
    assert len(rows) == 10, done.stdout
    for m in rows:
        route, (duration, own, others, wait) = m.group(1), (float(g) for g in m.groups()[1:5])
        assert own + others + wait <= duration * (2 if route == "cpu_def" else 1) * 1.01, m.group(0)  # a worker thread too
        if route == "io":
            assert own < others, m.group(0)

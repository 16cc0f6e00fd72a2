"""The demo: Jaeger (tail-sampling as the compose stack does), Prometheus (with examples/alerts),
the collector and the Flask example under opentelemetry-instrument (its metrics thread hogging
the GIL), some load, then the slowest spans as Jaeger has them: duration, GIL wait, GIL hold,
and who held the GIL meanwhile; the slowest span's waits, each with the thread and the code that
held the GIL; the URL of the slowest trace in Jaeger's UI, and the alert's state. Then the async
example (FastAPI on uvicorn, the same hog) with 20 requests in flight on its loop: each
span's own hold beside the loop's time on the other requests and the wait.

    make demo                                      (or, as root: .venv/bin/python scripts/demo.py)
    .venv/bin/python scripts/demo.py --keep        (as root; keep the stack up, and the load on, until Enter:
                                                    GilContention goes pending, then fires after its for:)
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
import stack  # noqa: E402

SERVICE = "flask-gil-demo"
ROUTES = "/io,/cpu,/slow_c"
ASYNC_SERVICE = "fastapi-gil-demo"
ASYNC_ROUTES = "/io,/cpu,/cpu_def,/fanout"
RULES = ROOT / "examples" / "alerts" / "gil-rules.yml"


def blocker_name(fields: dict, prefix: str) -> str:
    """A blocker by its name, else as the thread with that id whose name is unknown (never a bare number)."""
    name = fields.get(f"{prefix}.name")
    return name if name is not None else f"thread {fields[f'{prefix}.native_id']} (name unknown)"


def blockers(span: dict) -> str:
    """Who held the GIL while the span waited, by time held: its top blocker (over all its long
    waits), then the next one its gil.wait events name."""
    tags = span["tags"]
    if "gil.top_blocker.thread.native_id" not in tags:
        return "-"
    top = blocker_name(tags, "gil.top_blocker.thread")
    others: collections.Counter = collections.Counter()
    for log in span.get("logs", []):
        fields = {f["key"]: f["value"] for f in log["fields"]}
        if "gil.blocker.hold_ms" in fields and blocker_name(fields, "gil.blocker.thread") != top:
            others[blocker_name(fields, "gil.blocker.thread")] += fields["gil.blocker.hold_ms"]
    shown = [f"{top} {tags['gil.top_blocker.hold_ms']:.1f}ms"]
    shown += [f"{name} {ms:.1f}ms" for name, ms in others.most_common(1)]
    return ", ".join(shown)


def table(spans: list[dict], rows: int) -> str:
    lines = [f"{'span':<14} {'duration':>9} {'GIL wait':>9} {'GIL hold':>9} {'wait %':>7}  held the GIL meanwhile"]
    for s in sorted(spans, key=lambda s: s["duration"], reverse=True)[:rows]:
        t = s["tags"]
        lines.append(
            f"{s['operationName']:<14} {s['duration'] / 1e3:>7.1f}ms {t['gil.wait_ms']:>7.1f}ms {t['gil.hold_ms']:>7.1f}ms "
            f"{100 * t['gil.wait_ratio']:>6.1f}%  {blockers(s)}"
        )
    return "\n".join(lines)


def async_table(spans: list[dict], rows: int) -> str:
    """The async example's slowest requests: its own hold, the loop's on the others meanwhile, the wait."""
    lines = [f"{'span':<13} {'duration':>9} {'own hold':>9} {'others on its loop':>19} {'GIL wait':>9} {'wait %':>7}"]
    measured = [s for s in spans if "gil.hold_ms" in s["tags"]]  # (not the first ones while registering)
    for s in sorted(measured, key=lambda s: s["duration"], reverse=True)[:rows]:
        t = s["tags"]
        lines.append(
            f"{s['operationName']:<13} {s['duration'] / 1e3:>7.1f}ms {t['gil.hold_ms']:>7.1f}ms "
            f"{t.get('gil.others_hold_ms', 0):>17.1f}ms {t['gil.wait_ms']:>7.1f}ms {100 * t['gil.wait_ratio']:>6.1f}%"
        )
    return "\n".join(lines)


def waits(span: dict) -> str:
    """The span's gil.wait events, one a line: when, how long, who held the GIL and in which code."""
    lines = [f"the slowest span's waits for the GIL ({span['operationName']}, {span['duration'] / 1e3:.1f}ms; "
             "each also a gil.wait bar in its trace):"]
    for log in sorted(span.get("logs", []), key=lambda log: log["timestamp"]):
        f = {field["key"]: field["value"] for field in log["fields"]}
        where = f.get("gil.blocker.code.function.name")
        if where:
            where = f"in {where} ({Path(f['gil.blocker.code.file.path']).name}:{f.get('gil.blocker.code.line.number', '?')})"
        held = f"held it {f['gil.blocker.hold_ms']:.1f}ms" if "gil.blocker.hold_ms" in f else "released it last"
        lines.append(f"  +{(log['timestamp'] - span['startTime']) / 1e3:>6.1f}ms  waited {f['gil.wait_ms']:>5.1f}ms: "
                     f"{blocker_name(f, 'gil.blocker.thread')} {held} "
                     f"{where or '(code not located)'}")
    return "\n".join(lines)


def load(url: str, requests: int, max_seconds: int = 120, routes: str = ROUTES, concurrency: int = 4) -> list[str]:
    return [sys.executable, str(ROOT / "examples" / "load.py"), "--url", url, "--routes", routes,
            "--requests", str(requests), "--concurrency", str(concurrency), "--max-seconds", str(max_seconds)]


def trace_link(trace_id: str, why_no_ui: Callable[[], str], base: str = stack.JAEGER_QUERY) -> str:
    """The trace's page in the UI of the Jaeger at ``base``; where it serves none, its JSON and ``why_no_ui()``."""
    if stack.jaeger_serves_ui(base):
        return f"the slowest trace in Jaeger's UI: {base}/trace/{trace_id}"
    return f"no Jaeger UI to show it in ({why_no_ui()}): the slowest trace's JSON is at {base}/api/traces/{trace_id}"


def why_no_ui() -> str:
    ui = stack.jaeger_ui()
    return ui.detail if ui.source == "none" else f"the Jaeger answering on {stack.JAEGER_QUERY} is not the demo's"


def alert_status() -> str:
    """GilContention as Prometheus evaluates it now, with the figure its rule thresholds."""
    deadline = time.monotonic() + 20  # the app exports every second, the rules run every 2
    while not (ratio := stack.prometheus_api("query", query=f'process:gil_wait_ratio:rate5m{{job="{SERVICE}"}}')
               ["result"]) and time.monotonic() < deadline:
        time.sleep(0.5)
    value = f"{float(ratio[0]['value'][1]):.2f}" if ratio else "no data (see the app's log)"
    states = [a["state"] for a in stack.prometheus_api("alerts")["alerts"]
              if a["labels"].get("alertname") == "GilContention" and a["labels"].get("job") == SERVICE]
    return (f"Prometheus ({stack.PROMETHEUS}/api/v1/alerts): GilContention {states[0] if states else 'inactive'}; "
            f"its rule's 5-minute wait ratio is {value} (pending above 0.5, firing after 10 minutes of it)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=150, help="requests to send (default 150)")
    parser.add_argument("--short", action="store_true", help="a quick run (40 requests), as CI does")
    parser.add_argument("--rows", type=int, default=10, help="spans to show")
    parser.add_argument("--keep", action="store_true", help="keep the stack running until Enter is pressed")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("demo: the collector is eBPF and needs root: make demo (it uses sudo), or run this as root")
    requests = 40 if args.short else args.requests
    work = Path(tempfile.mkdtemp(prefix="otel-gil-demo-"))
    started: list[stack.Service] = []
    try:
        if stack.jaeger_up():
            print(f"Jaeger: using the one already answering on {stack.JAEGER_QUERY}", flush=True)
        else:
            print("Jaeger: starting its release binary where it downloads, else a build of its Go module (the first "
                  "run builds it: about 8 minutes), its tail sampling keeping every GIL-bound trace "
                  f"({stack.TAIL_SAMPLING.relative_to(ROOT)})...", flush=True)
            started.append(stack.start_jaeger(work / "jaeger.log", tail_sampling=True))
            print(f"Jaeger: {stack.jaeger_ui()}", flush=True)
        if stack.prometheus_up():
            print(f"Prometheus: using the one already answering on {stack.PROMETHEUS}", flush=True)
        else:
            print("Prometheus: starting the cached build with examples/alerts (the first run builds it)...", flush=True)
            started.append(stack.start_prometheus(work, [RULES], evaluation_interval="2s"))
        print("collector: compiling and loading the eBPF program...", flush=True)
        collector = stack.start_collector(str(work / "otel-gil.sock"), work / "collector.log")
        started.append(collector)
        print("Flask example under opentelemetry-instrument, metrics thread hogging the GIL...", flush=True)
        app = stack.start_app("flask", "dev", 18080, SERVICE, collector.address, work / "app.log", metrics=True)
        started.append(app)
        print(f"driving {requests} requests on {ROUTES}...", flush=True)
        subprocess.run(load(app.address, requests), check=True)
        stack.wait_for_spans(SERVICE, "GET /io", requests // 3)
        spans = [s for s in stack.jaeger_spans(SERVICE) if s["tags"].get("span.kind") == "server"]
        print(f"\nslowest of {len(spans)} server spans, from Jaeger ({stack.JAEGER_QUERY}/api/traces?service={SERVICE}):\n")
        print(table(spans, args.rows))
        print(f"\n{waits(max(spans, key=lambda s: s['duration']))}")
        slowest = max(spans, key=lambda s: s["duration"])
        print(f"\n{trace_link(slowest['traceID'], why_no_ui)}\n{alert_status()}")
        print("\nthe async example (FastAPI on uvicorn's loop, the same hog), 20 requests in flight...", flush=True)
        async_app = stack.start_app("fastapi", "uvicorn", 18081, ASYNC_SERVICE, collector.address, work / "async.log")
        started.append(async_app)
        subprocess.run(load(async_app.address, requests, routes=ASYNC_ROUTES, concurrency=20), check=True)
        stack.wait_for_spans(ASYNC_SERVICE, "GET /io", requests // 4)
        async_spans = [s for s in stack.jaeger_spans(ASYNC_SERVICE) if s["tags"].get("span.kind") == "server"]
        print(f"\nslowest of {len(async_spans)} server spans on one event loop: each request's own hold, the loop's "
              "on the others while it was in flight, and its wait:\n")
        print(async_table(async_spans, args.rows))
        if args.keep:
            with subprocess.Popen(load(app.address, 10**7, 3600), stdout=subprocess.DEVNULL) as background:
                input("\nthe load goes on; press Enter to stop everything. ")
                background.terminate()
            print(alert_status())
    except stack.StackError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1
    finally:
        for service in reversed(started):
            service.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

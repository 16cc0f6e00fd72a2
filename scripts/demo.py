"""The demo: Jaeger, the collector and the Flask example under opentelemetry-instrument
(its metrics thread hogging the GIL), some load, then the slowest spans as Jaeger
has them: duration, GIL wait, GIL hold, and who held the GIL meanwhile.

    sudo make demo                                 (or: sudo .venv/bin/python scripts/demo.py)
    sudo .venv/bin/python scripts/demo.py --keep   (leave the stack up to browse Jaeger's API)
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
import stack  # noqa: E402

SERVICE = "flask-gil-demo"
ROUTES = "/io,/cpu,/slow_c"


def blockers(span: dict) -> str:
    """Who held the GIL while the span waited, by time held: its top blocker (over all its long
    waits), then the next one its gil.wait events name."""
    tags = span["tags"]
    top = tags.get("gil.top_blocker.thread.name")
    if top is None:
        return "-"
    others: collections.Counter = collections.Counter()
    for log in span.get("logs", []):
        fields = {f["key"]: f["value"] for f in log["fields"]}
        if fields.get("gil.blocker.thread.name", top) != top:
            others[fields["gil.blocker.thread.name"]] += fields.get("gil.blocker.hold_ms", 0)
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=150, help="requests to send (default 150)")
    parser.add_argument("--short", action="store_true", help="a quick run (40 requests), as CI does")
    parser.add_argument("--rows", type=int, default=10, help="spans to show")
    parser.add_argument("--keep", action="store_true", help="keep the stack running until Enter is pressed")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("demo: the collector is eBPF and needs root: sudo make demo")
    requests = 40 if args.short else args.requests
    work = Path(tempfile.mkdtemp(prefix="otel-gil-demo-"))
    started: list[stack.Service] = []
    try:
        if stack.jaeger_up():
            print(f"Jaeger: using the one already answering on {stack.JAEGER_QUERY}", flush=True)
        else:
            print("Jaeger: starting the cached build (the first run builds it: about 8 minutes)...", flush=True)
            started.append(stack.start_jaeger(work / "jaeger.log"))
        print("collector: compiling and loading the eBPF program...", flush=True)
        collector = stack.start_collector(str(work / "otel-gil.sock"), work / "collector.log")
        started.append(collector)
        print("Flask example under opentelemetry-instrument, metrics thread hogging the GIL...", flush=True)
        app = stack.start_app("flask", "dev", 18080, SERVICE, collector.address, work / "app.log")
        started.append(app)
        print(f"driving {requests} requests on {ROUTES}...", flush=True)
        subprocess.run([sys.executable, str(ROOT / "examples" / "load.py"), "--url", app.address, "--routes", ROUTES,
                        "--requests", str(requests), "--concurrency", "4"], check=True)
        stack.wait_for_spans(SERVICE, "GET /io", requests // 3)
        spans = [s for s in stack.jaeger_spans(SERVICE) if s["tags"].get("span.kind") == "server"]
        print(f"\nslowest of {len(spans)} server spans, from Jaeger ({stack.JAEGER_QUERY}/api/traces?service={SERVICE}):\n")
        print(table(spans, args.rows))
        if args.keep:
            input(f"\nJaeger answers on {stack.JAEGER_QUERY}; press Enter to stop everything. ")
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

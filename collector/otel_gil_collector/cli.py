"""The root tools' subcommands of ``otel-gil`` (``report``, ``top``), added to otel_gil's
command line through the ``otel_gil.commands`` entry points of otel-gil-collector."""

from __future__ import annotations

import argparse
import sys


def _duration(text: str) -> float:
    value = float(text[:-1]) if text.endswith("s") else float(text)
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError("a duration between 0 and 3600 s, e.g. 10s")
    return value


def _attach_errors(command: str, run) -> int:
    """Run ``run()``; an attach problem becomes one line on stderr (what to do) and exit status 1."""
    from otel_gil_collector.attach import AttachError

    try:
        return run()
    except AttachError as exc:
        print(f"otel-gil {command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _report(args: argparse.Namespace) -> int:
    from otel_gil_collector import report, timeline

    def run() -> int:
        captured = report.capture(args.pid, args.duration, report.progress_to_stderr)
        if args.timeline and "gil" in captured.report:
            report.progress_to_stderr(f"no timeline ({captured.report['gil']}): it draws GIL holds and waits")
        elif args.timeline:
            report.progress_to_stderr(f"timeline written to {timeline.write(captured, args.timeline)}")
        print(report.to_json(captured.report) if args.json else report.render(captured.report))
        return 0

    return _attach_errors("report", run)


def _top(args: argparse.Namespace) -> int:
    from otel_gil_collector import top
    from otel_gil_collector.attach import Attachment
    from otel_gil_collector.report import progress_to_stderr

    def run() -> int:
        with Attachment(args.pid, "otel-gil top", progress_to_stderr) as att:
            if args.batch or not sys.stdout.isatty():
                top.batch(att, args.interval, args.count)
            else:
                top.live(att, args.interval)
        return 0

    return _attach_errors("top", run)


def add_report(sub) -> None:
    rep = sub.add_parser("report", help="per-thread GIL wait and hold of a running Python process (root)")
    rep.add_argument("--pid", type=int, required=True, help="the process to attach to")
    rep.add_argument("--duration", type=_duration, default=10.0, help="capture length, e.g. 10s (default 10s)")
    rep.add_argument("--json", action="store_true", help="machine-readable output")
    rep.add_argument("--timeline", metavar="OUT.html", help="also write a per-thread timeline of holds and waits")
    rep.set_defaults(func=_report)


def add_top(sub) -> None:
    live = sub.add_parser("top", help="live per-thread GIL view of a running Python process (root; free-threaded: "
                                       "parked time); q quits")
    live.add_argument("--pid", type=int, required=True, help="the process to attach to")
    live.add_argument("--interval", type=_duration, default=1.0, help="refresh every, e.g. 2s (default 1s)")
    live.add_argument("--batch", action="store_true", help="print a frame per interval instead of a live screen")
    live.add_argument("--count", type=int, help="with --batch: stop after this many frames")
    live.set_defaults(func=_top)

"""otel-gil: the user's command line.

Examples:
    otel-gil check                                  # which backend would an app use, and do figures flow?
    otel-gil check --backend inprocess              # the in-process hooks (no root, no collector)
    otel-gil check --backend collector --socket /tmp/otel-gil.sock
    sudo otel-gil report --pid 1234 --duration 10s  # per-thread GIL figures of any Python process
    sudo otel-gil report --pid 1234 --json
    sudo otel-gil report --pid 1234 --timeline gil.html  # which thread held the GIL when
    sudo otel-gil top --pid 1234                     # live, per thread; q quits
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

from otel_gil import ring as ringlib
from otel_gil import backend
from otel_gil.client import REGISTERED


def _check(args: argparse.Namespace) -> int:
    reg = backend.start(args.backend, args.socket, 1_000_000, args.timeout)
    if reg.status != REGISTERED:
        print(f"no GIL figures with the {reg.kind} backend ({reg.status}): {reg.detail or 'no answer in time'}",
              file=sys.stderr)
        return 1
    tid = threading.get_native_id()
    t0 = time.monotonic()
    for _ in range(100):
        time.sleep(0)  # GIL hand-offs the backend must see
    ring = reg.ring
    index = ring.find(tid)
    got = ringlib.counters(ring.slot(index), time.monotonic_ns()) if index >= 0 else ringlib.ZERO
    reg.stop()
    where = f"the collector at {reg.socket_path}" if reg.kind == backend.COLLECTOR else "in-process GOT hooks"
    print(f"backend: {reg.kind} ({where}), {ring.nslots} thread slots")
    print(f"this thread: {got.acquisitions} GIL acquisitions, held {got.hold_ns / 1e6:.3f} ms "
          f"of {(time.monotonic() - t0) * 1e3:.3f} ms")
    return 0 if got.acquisitions >= 100 else 1


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
        if args.timeline:
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="otel-gil", description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="start the backend an app would use (auto: the collector if it answers, "
                           "else in-process) and verify figures flow")
    check.add_argument("--backend", choices=backend.KINDS, help="default $OTEL_GIL_BACKEND or auto")
    check.add_argument("--socket", help="collector socket (default $OTEL_GIL_SOCKET or /run/otel-gil/otel-gil.sock)")
    check.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the collector's answer")
    check.set_defaults(func=_check)
    rep = sub.add_parser("report", help="per-thread GIL wait and hold of a running Python process (root)")
    rep.add_argument("--pid", type=int, required=True, help="the process to attach to")
    rep.add_argument("--duration", type=_duration, default=10.0, help="capture length, e.g. 10s (default 10s)")
    rep.add_argument("--json", action="store_true", help="machine-readable output")
    rep.add_argument("--timeline", metavar="OUT.html", help="also write a per-thread timeline of holds and waits")
    rep.set_defaults(func=_report)
    live = sub.add_parser("top", help="live per-thread GIL view of a running Python process (root); q quits")
    live.add_argument("--pid", type=int, required=True, help="the process to attach to")
    live.add_argument("--interval", type=_duration, default=1.0, help="refresh every, e.g. 2s (default 1s)")
    live.add_argument("--batch", action="store_true", help="print a frame per interval instead of a live screen")
    live.add_argument("--count", type=int, help="with --batch: stop after this many frames")
    live.set_defaults(func=_top)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

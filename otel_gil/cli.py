"""otel-gil: the user's command line.

Examples:
    otel-gil check                                  # can this process register and get figures?
    otel-gil check --socket /tmp/otel-gil.sock
    sudo otel-gil report --pid 1234 --duration 10s  # per-thread GIL figures of any Python process
    sudo otel-gil report --pid 1234 --json
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

from otel_gil import ring as ringlib
from otel_gil.client import REGISTERED, Registration


def _check(args: argparse.Namespace) -> int:
    reg = Registration(args.socket)
    reg.start()
    if not reg.wait(args.timeout):
        print(f"no answer from the collector within {args.timeout:.0f} s", file=sys.stderr)
        return 1
    if reg.status != REGISTERED:
        print(f"not registered ({reg.status}): {reg.detail}", file=sys.stderr)
        return 1
    tid = threading.get_native_id()
    t0 = time.monotonic()
    for _ in range(100):
        time.sleep(0)  # GIL hand-offs the collector must see
    ring = reg.ring
    index = ring.find(tid)
    got = ringlib.counters(ring.slot(index), time.monotonic_ns()) if index >= 0 else ringlib.ZERO
    reg.stop()
    print(f"registered with {reg.socket_path}: {ring.nslots} thread slots")
    print(f"this thread: {got.acquisitions} GIL acquisitions, held {got.hold_ns / 1e6:.3f} ms "
          f"of {(time.monotonic() - t0) * 1e3:.3f} ms")
    return 0 if got.acquisitions >= 100 else 1


def _duration(text: str) -> float:
    value = float(text[:-1]) if text.endswith("s") else float(text)
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError("a duration between 0 and 3600 s, e.g. 10s")
    return value


def _report(args: argparse.Namespace) -> int:
    from otel_gil import report

    try:
        result = report.capture(args.pid, args.duration, lambda msg: print(msg, file=sys.stderr, flush=True))
    except SystemExit as exc:
        print(exc.code if isinstance(exc.code, str) else exc, file=sys.stderr)
        return 2
    except Exception as exc:  # UnsupportedProcess and friends: one line, the reason
        print(f"otel-gil report: {exc}", file=sys.stderr)
        return 1
    print(report.to_json(result) if args.json else report.render(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="otel-gil", description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]), formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="register with the collector and verify figures flow")
    check.add_argument("--socket", help="collector socket (default $OTEL_GIL_SOCKET or /run/otel-gil/otel-gil.sock)")
    check.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the collector")
    check.set_defaults(func=_check)
    rep = sub.add_parser("report", help="per-thread GIL wait and hold of a running Python process (root)")
    rep.add_argument("--pid", type=int, required=True, help="the process to attach to")
    rep.add_argument("--duration", type=_duration, default=10.0, help="capture length, e.g. 10s (default 10s)")
    rep.add_argument("--json", action="store_true", help="machine-readable output")
    rep.set_defaults(func=_report)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

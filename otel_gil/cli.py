"""otel-gil: the user's command line (no root needed for ``check``).

Examples:
    otel-gil check                      # can this process register and get figures?
    otel-gil check --socket /tmp/otel-gil.sock
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
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

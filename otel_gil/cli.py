"""otel-gil: the user's command line.

Examples:
    otel-gil check                                  # which backend would an app use, and do figures flow?
    otel-gil check --backend inprocess              # the in-process hooks (no root, no collector)
    otel-gil check --backend collector --socket /tmp/otel-gil.sock
    sudo otel-gil report --pid 1234 --duration 10s  # per-thread GIL figures of any Python process
    sudo otel-gil report --pid 1234 --json
    sudo otel-gil report --pid 1234 --timeline gil.html  # which thread held the GIL when
    sudo otel-gil top --pid 1234                     # live, per thread; q quits

``check`` is the app side's own. ``report`` and ``top`` are root tools: the
otel-gil-collector distribution adds them through the ``otel_gil.commands``
entry-point group (each entry point is a function that adds its subcommand to
the parser's subparsers); without it they say how to get them.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from importlib.metadata import entry_points

from otel_gil import backend
from otel_gil import ring as ringlib
from otel_gil.semconv import REGISTERED

COMMANDS_GROUP = "otel_gil.commands"
ROOT_TOOLS = ("report", "top")  # otel-gil-collector's subcommands


def _check(args: argparse.Namespace) -> int:
    reg = backend.start(args.backend, args.socket, 1_000_000, args.timeout)
    state = reg.state
    if state.status != REGISTERED:
        print(f"no GIL figures with the {reg.kind} backend ({state.status}): {state.detail or 'no answer in time'}",
              file=sys.stderr)
        return 1
    tid = threading.get_native_id()
    t0 = time.monotonic()
    for _ in range(100):
        time.sleep(0)  # GIL hand-offs the backend must see
    ring = state.ring
    index = ring.find(tid)
    got = ringlib.counters(ring.slot(index), time.monotonic_ns()) if index >= 0 else ringlib.ZERO
    reg.stop()
    where = f"the collector at {reg.socket_path}" if reg.kind == backend.COLLECTOR else "in-process GOT hooks"
    print(f"backend: {reg.kind} ({where}), {ring.nslots} thread slots")
    print(f"this thread: {got.acquisitions} GIL acquisitions, held {got.hold_ns / 1e6:.3f} ms "
          f"of {(time.monotonic() - t0) * 1e3:.3f} ms")
    return 0 if got.acquisitions >= 100 else 1


def _missing_root_tool(args: argparse.Namespace) -> int:
    print(f"otel-gil {args.command}: the root tools are not installed here: pip install otel-gil-collector "
          "(and bcc: apt install python3-bpfcc), then run it as root", file=sys.stderr)
    return 1


def _add_root_tools(sub) -> None:
    """Subcommands of installed distributions (otel-gil-collector: report, top); the missing ones say how to get them."""
    for ep in entry_points(group=COMMANDS_GROUP):
        ep.load()(sub)
    for name in ROOT_TOOLS:
        if name not in sub.choices:
            missing = sub.add_parser(name, help="a root tool of otel-gil-collector (not installed)", add_help=False)
            missing.add_argument("rest", nargs=argparse.REMAINDER)
            missing.set_defaults(func=_missing_root_tool)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="otel-gil", description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n")[1], formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="start the backend an app would use (auto: the collector if it answers, "
                           "else in-process) and verify figures flow")
    check.add_argument("--backend", choices=backend.KINDS, help="default $OTEL_GIL_BACKEND or auto")
    check.add_argument("--socket", help="collector socket (default $OTEL_GIL_SOCKET or /run/otel-gil/otel-gil.sock)")
    check.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the collector's answer")
    check.set_defaults(func=_check)
    _add_root_tools(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

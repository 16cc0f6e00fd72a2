"""User-space instructions otel-gil adds per span and per GIL hand-off, this checkout against
another: a measure the machine's load moves far less than time (``perf stat -e instructions:u``).

    .venv/bin/python bench/instructions.py --baseline CHECKOUT [--spans 20000] [--pairs 200000] [--repeats 3]

Each figure is the difference between two runs of one process, N and N + --spans spans (or
--pairs pipe write + read pairs), so start-up cancels out; with otel-gil minus without it
(the C span hooks on a TracerProvider, or the in-process backend), with PYTHONHASHSEED=0.
The median of --repeats. Writes the section "instructions against a baseline" of
bench/RESULTS.md. Needs perf, and perf_event_paranoid <= 2 or root.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
import results  # noqa: E402

SPANS = r"""
import sys
from opentelemetry.sdk.trace import TracerProvider
from otel_gil.inprocess import InProcess
from otel_gil.spans import GilSpanProcessor, hook_provider
registration = InProcess()
registration.start()
provider = TracerProvider()
if sys.argv[2] == "1":
    hook = GilSpanProcessor(registration, None, fast=True)
    assert hook._hooks is not None, "otel_gil._fastspan is not built: pip install -e ."
    hook_provider(provider, hook)
tracer = provider.get_tracer("bench")
for _ in range(int(sys.argv[1])):
    tracer.start_span("op").end()
"""
HANDOFFS = r"""
import os, sys
if sys.argv[2] == "1":
    from otel_gil.inprocess import InProcess
    registration = InProcess()
    registration.start()
    state = getattr(registration, "state", registration)  # a --baseline from before the one-value State
    assert state.status == "ok", state.detail
r, w = os.pipe()
for _ in range(int(sys.argv[1])):
    os.write(w, b"x"); os.read(r, 1)
"""
WARM = 1000  # the shorter run's count


def instructions(code: str, n: int, on: bool, checkout: Path) -> int:
    where = results.python_in(checkout)
    done = subprocess.run(["perf", "stat", "-x,", "-e", "instructions:u", sys.executable, "-c", code, str(n),
                           "1" if on else "0"], capture_output=True, text=True, cwd=where["cwd"],
                          env={**where["env"], "PYTHONHASHSEED": "0"}, check=True)
    (line,) = [row for row in done.stderr.splitlines() if "instructions" in row]
    return int(line.split(",")[0])


def added(code: str, n: int, checkout: Path) -> float:
    """Instructions otel-gil adds per unit of ``code``'s loop."""
    per = {on: (instructions(code, WARM + n, on, checkout) - instructions(code, WARM, on, checkout)) / n
           for on in (False, True)}
    return per[True] - per[False]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, required=True, help="another otel-gil checkout (C parts built in place)")
    parser.add_argument("--spans", type=int, default=20_000)
    parser.add_argument("--pairs", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if shutil.which("perf") is None:
        raise SystemExit("instructions.py: perf not on PATH (linux-perf, or linux-tools-$(uname -r))")
    rows = []
    for what, code, n, unit in (("span (C hooks)", SPANS, args.spans, 1), ("hand-off (in-process)", HANDOFFS, args.pairs, 2)):
        here, there = ([added(code, n, checkout) / unit for _ in range(args.repeats)] for checkout in (ROOT, args.baseline))
        rows.append(f"| {what} | {statistics.median(here):.0f} ({min(here):.0f}-{max(here):.0f}) | "
                    f"{statistics.median(there):.0f} ({min(there):.0f}-{max(there):.0f}) | "
                    f"{statistics.median(here) - statistics.median(there):+.0f} |")
        print(rows[-1], flush=True)
    section = "\n".join([
        f"`.venv/bin/python bench/instructions.py --baseline {args.baseline} --spans {args.spans} --pairs {args.pairs} "
        f"--repeats {args.repeats}` on {results.machine()}. User-space instructions (`perf stat -e instructions:u`) "
        "otel-gil adds, medians of the repeats (their range in brackets): a figure the machine's load moves far less "
        "than the timed benchmarks above, which swing by more than the difference looked for.",
        "",
        "| per | this checkout | baseline | difference |",
        "|---|---|---|---|",
        *rows,
    ])
    results.write_section("instructions against a baseline", section)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())

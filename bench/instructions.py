"""User-space instructions otel-gil adds per span and per GIL hand-off: a measure the machine's
load does not move (time does), for targets and for a CI guard.

    .venv/bin/python bench/instructions.py [--baseline CHECKOUT] [--spans 1000] [--long-spans 100] [--pairs 5000] [--repeats 1]
    .venv/bin/python bench/instructions.py --check   # valgrind, against bench/instructions.json: > 10 % more fails
    .venv/bin/python bench/instructions.py --record  # rewrite bench/instructions.json (the least of layouts 0-2)

Each figure is the difference between two runs of one process, N and N + --spans spans (or
--pairs pipe write + read pairs), so start-up cancels out; with otel-gil minus without it
(the C span hooks on a TracerProvider, or the in-process backend), with PYTHONHASHSEED=0.
Counted by ``perf stat -e instructions:u`` where the CPU's counters are there, else by
valgrind (cachegrind, no cache simulation): its count is exact, so a few thousand spans do.
Spans are calm (no long wait: its threshold is set past any span, as valgrind's slowness
would otherwise make one), or (--long-spans) each waits 20 ms for the GIL a thread named
"blocker" holds through a ctypes.PyDLL call, past the 1 ms long wait (and short of the switch
interval, set to 100 ms: no forced switch): the figure is per span that names it (at least half
of them must, or the run fails; with a 4 ms hold, a loaded machine ran the span's thread after
the hold in more than half of them under valgrind). The median of --repeats. Writes the section "instructions" of
bench/RESULTS.md (with --baseline: "instructions against a baseline").

A process's count moves with where its objects land and which version tags its types get:
CPython's method cache (4,096 entries, indexed by a type's version tag and the name's
address) keeps one of two lookups that share an entry, so a few of the SDK's per-span
lookups miss in one layout and hit in another, some 400 instructions each, with otel-gil
and without it alike (hooking Span gives the class a new tag). So the processes get a fixed
environment (PATH, HOME and the Python variables), and repeat k makes k classes and
192 * k objects before anything else (LAYOUT): the repeats' median and range are over that
many layouts, not one layout counted again. (A layout by the environment's size alone, as
before, moved little of this: three such layouts gave 3,884-3,994 per calm span where
eight of these gave 2,608-3,272, median ~3,200, for the same build.) The paths a process
holds move its layout too (one build's calm span with SDK cost 105,027, 106,375 and 106,932
instructions run from three paths; its long-wait figure 9,940-10,441 as guard from two
clones, against a 10 % slack), and so do the names in a directory on sys.path (an untracked
file in otel_gil/, 30 per span): every process runs from one path, ALIAS, where links name
the modules of the checkout's otel_gil this Python imports, the bench's, and the Python
environment, and without site (-S), whose .pth files name the checkout an editable install
came from; so a clean clone counts as the clone it was recorded in.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import site
import statistics
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from typing import Iterator, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import results  # noqa: E402

# The providers get a resource of their own: TracerProvider() runs the resource detectors in a
# thread pool that starts one thread or two as the OS schedules them, ~145,000 instructions more
# or less in a process at random (1,450 per span in a figure of 100 spans).
LAYOUT = r"""
import os
_layout = int(os.environ["OTEL_GIL_BENCH_LAYOUT"])  # (see the docstring)
_kept = [type(f"Layout{i}", (), {"x": i})().x for i in range(_layout)], [object() for _ in range(192 * _layout)]
"""
TRACER = LAYOUT + r"""
import sys
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from otel_gil.inprocess import InProcess
from otel_gil.spans import GilSpanProcessor, hook_provider
registration = InProcess(long_wait_ns=LONG_WAIT_NS)
registration.start()
provider = TracerProvider(resource=Resource({}))  # (see above)
import random
random.seed(0)  # the same span and trace ids in every process
if sys.argv[2] == "1":
    hook = GilSpanProcessor(registration, None, fast=True)
    assert hook._hooks is not None, "otel_gil._fastspan is not built: pip install -e ."
    hook_provider(provider, hook)
tracer = provider.get_tracer("bench")
"""
SPANS = TRACER.replace("LONG_WAIT_NS", "10**12") + r"""
for _ in range(int(sys.argv[1])):
    tracer.start_span("op").end()
"""
LONG_WAITS = TRACER.replace("LONG_WAIT_NS", "1_000_000") + r"""
import ctypes, threading
if sys.argv[2] == "1":
    from otel_gil import threads
    threads.watch_starts()  # as GilInstrumentor does: the blocker's name without reading /proc
usleep = ctypes.PyDLL(None).usleep  # holds the GIL through the call
sys.setswitchinterval(0.1)  # past the hold: no forced switch (a 4 ms hold has none at native speed)
go, entered = threading.Lock(), threading.Lock()
go.acquire()
entered.acquire()


def hold():
    while True:
        go.acquire()
        entered.release()
        usleep(20000)  # this thread holds the GIL 20 ms meanwhile


threading.Thread(target=hold, name="blocker", daemon=True).start()
named = 0
for _ in range(int(sys.argv[1])):
    span = tracer.start_span("op")
    go.release()
    entered.acquire()  # the blocker took the GIL: this thread waits for it 20 ms
    span.end()
    named += span.attributes.get("gil.top_blocker.thread.name") == "blocker"
print(f"named {named}", file=sys.stderr)
"""
HANDOFFS = LAYOUT + r"""
import sys
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
REQUESTS = LAYOUT + r"""
import asyncio, sys
from opentelemetry import trace
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.sdk.trace import TracerProvider
provider = TracerProvider()
trace.set_tracer_provider(provider)
import asyncload_app
if sys.argv[2] == "1":
    from otel_gil import GilInstrumentor
    GilInstrumentor().instrument(tracer_provider=provider, backend="inprocess", long_wait_ms=10**6)
FastAPIInstrumentor.instrument_app(asyncload_app.app, tracer_provider=provider)
route = sys.argv[3]
scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
         "path": route, "raw_path": route.encode(), "query_string": b"", "root_path": "", "headers": [(b"host", b"x")],
         "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1)}

async def receive():
    return {"type": "http.request", "body": b"", "more_body": False}

async def send(message):
    assert message.get("status", 200) == 200, message

async def main():
    for _ in range(int(sys.argv[1])):
        await asyncload_app.app(scope, receive, send)
asyncio.run(main())
"""
WARM = 500  # the shorter run's count
LONG_WARM = 20  # the shorter run's count of spans with a long wait (20 ms each)
NAMED = 0.5  # share of the spans with a long wait that must name their blocker (under load, the OS runs the span's
# thread after the blocker's hold now and then: no wait then)
LONG = "span with a long wait, blocker named"
BUDGET = ROOT / "bench" / "instructions.json"  # the figures --check holds a change to (valgrind's, this Python)
SLACK = 1.10  # --check: a change adding more than 10 % fails
GUARD_LAYOUTS = 3  # --check's figure: the least of layouts 0 to 2
ALIAS = Path("/tmp/otel-gil-instructions")  # the one path every counted process runs from (see the docstring)
TARGETS = {"span (C hooks)": 3000, LONG: 5000, "hand-off (in-process)": 300}


def counter(tool: str) -> list[str]:
    """The command line prefix that counts a process's user-space instructions (on stderr)."""
    if tool == "auto":
        tool = "perf" if shutil.which("perf") and _perf_counts() else "valgrind"
    if shutil.which(tool) is None:
        raise SystemExit(f"instructions.py: {tool} not on PATH (apt-get install {'linux-perf' if tool == 'perf' else tool})")
    if tool == "perf":
        return ["perf", "stat", "-x,", "-e", "instructions:u"]
    return ["setarch", "-R", "valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null"]


def _perf_counts() -> bool:
    done = subprocess.run(["perf", "stat", "-x,", "-e", "instructions:u", "true"], capture_output=True, text=True)
    return done.returncode == 0 and "<not" not in done.stderr


def instructions(prefix: list[str], code: str, n: int, on: bool, checkout: Path, *extra: str,
                 layout: int = 0) -> tuple[int, Optional[int]]:
    """The process's instructions, and how many of its spans named their blocker (LONG_WAITS; else None)."""
    environment = Path(sys.prefix)
    packages = [ALIAS / "python" / Path(p).relative_to(environment) for p in site.getsitepackages()
                if Path(p).is_relative_to(environment)]
    env = {"PATH": "/usr/bin:/bin", "HOME": "/", "PYTHONHASHSEED": "0",
           "PYTHONDONTWRITEBYTECODE": "1",  # (a run that writes .pyc files costs more than the next)
           "PYTHONPATH": ":".join(map(str, [ALIAS / "checkout", ALIAS / "checkout" / "bench", *packages])),
           "OTEL_GIL_BENCH_LAYOUT": str(layout)}
    python = Path(sys.executable)
    if python.is_relative_to(environment):
        python = ALIAS / "python" / python.relative_to(environment)
    with _aliased(checkout):  # cwd: -c puts it first on sys.path, and it holds no module
        done = subprocess.run([*prefix, str(python), "-S", "-c", code, str(n), "1" if on else "0", *extra],
                              capture_output=True, text=True, cwd=ALIAS, env=env, check=True)
    named = [int(row.split()[1]) for row in done.stderr.splitlines() if row.startswith("named ")]
    if prefix[0] == "perf":
        (line,) = [row for row in done.stderr.splitlines() if "instructions" in row]
        return int(line.split(",")[0]), (named or [None])[0]
    (line,) = [row for row in done.stderr.splitlines() if "I   refs:" in row or "I    refs:" in row]
    return int(line.split(":")[1].replace(",", "")), (named or [None])[0]


@contextlib.contextmanager
def _aliased(checkout: Path) -> Iterator[None]:
    """ALIAS, under its lock: ``checkout``'s otel_gil as this Python imports it (its modules and
    this version's builds, linked one by one: a directory lists the same in every clone) and the
    bench's modules in ALIAS/checkout; ALIAS/python, a link to this Python's environment."""
    ALIAS.mkdir(exist_ok=True)
    if ALIAS.is_symlink() or ALIAS.stat().st_uid != os.getuid():
        raise SystemExit(f"instructions.py: {ALIAS} is not this user's directory: remove it, or run as its owner")
    with open(ALIAS / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        staged = ALIAS / "checkout"
        shutil.rmtree(staged, ignore_errors=True)
        for package, suffixes in ((checkout / "otel_gil", (".py", EXTENSION_SUFFIXES[0])), (ROOT / "bench", (".py",))):
            (staged / package.name).mkdir(parents=True)
            for module in sorted(package.iterdir()):
                if module.name.endswith(suffixes):
                    (staged / package.name / module.name).symlink_to(module.resolve())
        (ALIAS / "python").unlink(missing_ok=True)
        (ALIAS / "python").symlink_to(Path(sys.prefix).resolve())
        yield


def loop_instructions(prefix: list[str], code: str, n: int, on: bool, checkout: Path, warm: int = WARM,
                      *extra: str, layout: int = 0) -> tuple[int, Optional[int]]:
    """Instructions of ``n`` units of ``code``'s loop after ``warm`` (two runs' difference), and how
    many of those spans named their blocker (LONG_WAITS; else None)."""
    (before, named0), (after, named1) = (instructions(prefix, code, count, on, checkout, *extra, layout=layout)
                                         for count in (warm, warm + n))
    return after - before, None if named1 is None else named1 - named0


def per_unit(prefix: list[str], code: str, n: int, checkout: Path, warm: int = WARM, *extra: str) -> dict[bool, float]:
    """Instructions per unit of ``code``'s loop, without otel-gil and with it."""
    return {on: loop_instructions(prefix, code, n, on, checkout, warm, *extra)[0] / n for on in (False, True)}


def added(prefix: list[str], code: str, n: int, checkout: Path, warm: int = WARM, layout: int = 0) -> float:
    """Instructions otel-gil adds per unit of ``code``'s loop; LONG_WAITS': per span that named its
    blocker (the others, a few, cost a calm span's: their share of the figure is under 1 %)."""
    off, _ = loop_instructions(prefix, code, n, False, checkout, warm, layout=layout)
    on, named = loop_instructions(prefix, code, n, True, checkout, warm, layout=layout)
    units = n if named is None else named
    if units < NAMED * n:
        raise SystemExit(f"instructions.py: {units} of {n} spans had a long wait with their blocker named")
    return (on - off) / units


def requests(prefix: list[str], n: int) -> list[str]:
    """Rows of what a FastAPI request costs OpenTelemetry alone and what otel-gil adds, per route
    (bench/asyncload_app.py, driven in process on asyncio's loop, no server or socket)."""
    rows = []
    for route in ("/hello", "/fanout"):
        per = per_unit(prefix, REQUESTS, n, ROOT, 50, route)
        rows.append(f"| {route} | {per[False]:.0f} | {per[True] - per[False]:+.0f} | {per[False] / per[True]:.1%} |")
        print(rows[-1], flush=True)
    return rows


def measure(prefix: list[str], checkout: Path, spans: int, pairs: int, repeats: int, long_spans: int) -> dict[str, list[float]]:
    runs = (("span (C hooks)", SPANS, spans, 1, WARM), (LONG, LONG_WAITS, long_spans, 1, LONG_WARM),
            ("hand-off (in-process)", HANDOFFS, pairs, 2, WARM))
    return {what: [added(prefix, code, n, checkout, warm, layout) / unit for layout in range(repeats)]
            for what, code, n, unit, warm in runs}


def check(prefix: list[str], spans: int, pairs: int, long_spans: int) -> list[str]:
    """What this checkout adds beyond bench/instructions.json's figures by more than SLACK, in the
    least of layouts 0-2, as recorded (a layout alone moves a calm span's count by up to ~800, a
    change of the code moves them all)."""
    budget = json.loads(BUDGET.read_text())
    now = {what: min(v) for what, v in measure(prefix, ROOT, spans, pairs, GUARD_LAYOUTS, long_spans).items()}
    return [f"{what}: {now[what]:.0f} instructions, recorded {budget[what]:.0f} (> +{SLACK - 1:.0%})"
            for what in budget if now[what] > budget[what] * SLACK]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, help="another otel-gil checkout (C parts built in place)")
    parser.add_argument("--spans", type=int, default=1_000)
    parser.add_argument("--pairs", type=int, default=5_000)
    parser.add_argument("--long-spans", type=int, default=100, help="spans with a long wait (20 ms each)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--requests", type=int, default=0, help="also FastAPI requests per route (0: none)")
    parser.add_argument("--tool", choices=("auto", "perf", "valgrind"), default="auto")
    parser.add_argument("--check", action="store_true", help="fail if a figure is > 10 %% above bench/instructions.json")
    parser.add_argument("--record", action="store_true", help="write this checkout's figures to bench/instructions.json")
    args = parser.parse_args()
    prefix = counter("valgrind" if args.check or args.record else args.tool)  # the guard's figures: valgrind's
    if args.check:
        over = check(prefix, args.spans, args.pairs, args.long_spans)
        print("\n".join(over) or "within bench/instructions.json's figures")
        return 1 if over else 0
    here = measure(prefix, ROOT, args.spans, args.pairs, args.repeats, args.long_spans)
    if args.record:
        if args.repeats < GUARD_LAYOUTS:
            raise SystemExit(f"instructions.py: --record needs --repeats {GUARD_LAYOUTS} or more (the guard's layouts)")
        BUDGET.write_text(json.dumps({k: round(min(v[:GUARD_LAYOUTS])) for k, v in here.items()}, indent=1) + "\n")
    there = measure(prefix, args.baseline, args.spans, args.pairs, args.repeats, args.long_spans) if args.baseline else None
    rows = []
    for what, v in here.items():
        row = f"| {what} | {statistics.median(v):.0f} ({min(v):.0f}-{max(v):.0f}) |"
        if there is not None:
            w = there[what]
            row += f" {statistics.median(w):.0f} ({min(w):.0f}-{max(w):.0f}) | {statistics.median(v) - statistics.median(w):+.0f} |"
        else:
            row += f" ≤ {TARGETS[what]} | {'met' if statistics.median(v) <= TARGETS[what] else 'not met'} |"
        rows.append(row)
        print(row, flush=True)
    counted = "`perf stat -e instructions:u`" if prefix[0] == "perf" else "valgrind's cachegrind (`--cache-sim=no`)"
    command = (f"`.venv/bin/python bench/instructions.py{f' --baseline {args.baseline}' if args.baseline else ''}"
               f"{f' --requests {args.requests}' if args.requests else ''} "
               f"--spans {args.spans} --long-spans {args.long_spans} --pairs {args.pairs} --repeats {args.repeats}` on {results.machine()}")
    section = "\n".join([
        f"{command}. User-space instructions otel-gil adds, counted by {counted}, medians of the repeats (their "
        "range in brackets): a figure the machine's load does not move, unlike the timed benchmarks.",
        "",
        "| per | this checkout | baseline | difference |" if there else "| per | instructions added | target | |",
        "|---|---|---|---|",
        *rows,
    ])
    if args.requests:
        section += "\n".join([
            "", "", f"FastAPI requests (bench/asyncload_app.py under its OpenTelemetry instrumentation, {args.requests} "
            "requests per route driven in process on asyncio's loop; `--requests`): instructions per request",
            "", "| route | OpenTelemetry alone | otel-gil adds | throughput bound vs OpenTelemetry alone |",
            "|---|---|---|---|", *requests(prefix, args.requests)])
    results.write_section("instructions against a baseline" if there else "instructions", section)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())

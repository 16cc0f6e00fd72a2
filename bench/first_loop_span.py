"""What the first span on a uvloop loop pays, by when uvloop's GOT is hooked (module_switches.c).

Each round runs each mode in a fresh process (in-process backend, the C hooks): instrument(),
uvloop imported before or after it, then 200 spans on uvloop's loop, each timed; the first
span's time and the median of the rest. Modes: ``before`` (hooked at instrument()), ``import``
(imported after it: hooked as its import ends), ``first-span`` (loaded where no import hook sees
it: hooked by the first span that sees its loop, what every uvloop after instrument() paid before).

Usage: python bench/first_loop_span.py [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

MODES = ("before", "import", "first-span")
_CHILD = """if True:
    import sys, time
    mode = sys.argv[1]
    if mode != "import":
        import uvloop
    if mode == "first-span":
        loop_module = sys.modules.pop("uvloop.loop")  # unseen by instrument() and by the import hook
    from opentelemetry.sdk.trace import TracerProvider
    from otel_gil import GilInstrumentor, _fastspan
    provider = TracerProvider()
    GilInstrumentor().instrument(tracer_provider=provider, backend="inprocess")
    if mode == "import":
        import uvloop
    if mode == "first-span":
        sys.modules["uvloop.loop"] = loop_module
    hooked = _fastspan.module_switches()["uvloop.loop"]["hooked"]
    tracer = provider.get_tracer("bench")

    async def spans():
        took = []
        for _ in range(200):
            t0 = time.perf_counter_ns()
            with tracer.start_as_current_span("s"):
                pass
            took.append(time.perf_counter_ns() - t0)
        return took

    took = uvloop.run(spans())
    print(hooked, took[0], sorted(took[1:])[len(took) // 2])
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    runs: dict[str, list[tuple[int, int]]] = {mode: [] for mode in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            out = subprocess.run([sys.executable, "-c", _CHILD, mode], capture_output=True, text=True, check=True)
            hooked, first, rest = out.stdout.split()
            assert (hooked == "True") == (mode != "first-span"), (mode, hooked)
            runs[mode].append((int(first), int(rest)))
    print("| uvloop hooked | first span, us (median) | its slowest, us | later spans, us (median) |")
    print("|---|---|---|---|")
    for mode in MODES:
        firsts = [f for f, _ in runs[mode]]
        print(f"| {mode} | {statistics.median(firsts) / 1e3:.0f} | {max(firsts) / 1e3:.0f} | "
              f"{statistics.median(r for _, r in runs[mode]) / 1e3:.1f} |")
    print(json.dumps(runs))


if __name__ == "__main__":
    main()

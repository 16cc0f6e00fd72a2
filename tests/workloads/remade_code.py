"""Code objects remade over and over at the addresses of freed ones, each holding the GIL in a
``ctypes.PyDLL`` call at a line of its own while a victim waits: the in-process writer logs
each hold with its location.

Each call's code object is ``base.replace()`` with a fresh copy of one variant's line table
(the same function with 0-3 blank lines before its hold call) and, every other round, a first
line 10 further on; the previous call's code object and table were freed just before, so the
new ones mostly take their addresses: a writer that remembered lines by address alone would
give the previous call's line.

Usage: python remade_code.py; prints one JSON document: per call, the line of its hold call
(the truth), the addresses of its code object and line table, and the frames the in-process
writer logged.
"""

from __future__ import annotations

import ctypes
import json
import sys
import threading
import time
import types

from otel_gil.inprocess import InProcess

HOLD_US = 20_000  # past a 5 ms switch interval: the waiting victim's drop request ends the hold after the call
CALLS = 32
TABLE = "co_linetable" if sys.version_info >= (3, 10) else "co_lnotab"  # where a code object keeps its lines
SHIFT = 10


def variant(blank: int) -> tuple[types.CodeType, int]:
    """The function with ``blank`` blank lines before its hold call, and that call's line."""
    source = "def f(us):\n" + "\n" * blank + "    HOLD(us)\n"
    return compile(source, "remade.py", "exec").co_consts[0], 2 + blank


def main() -> dict:
    inprocess = InProcess()
    inprocess.start()
    assert inprocess.state.status == "ok", inprocess.state.detail
    ring, stop, calls, hold = inprocess.state.ring, threading.Event(), [], ctypes.PyDLL(None).usleep
    variants = [variant(blank) for blank in range(4)]
    base = variants[0][0]

    def victim() -> None:
        while not stop.is_set():
            time.sleep(0.0005)

    def hog() -> None:
        for i in range(CALLS):
            shift = SHIFT * (i // 4 % 2)
            table = bytes(memoryview(getattr(variants[i % 4][0], TABLE)))  # a new object
            code = base.replace(co_firstlineno=base.co_firstlineno + shift, **{TABLE: table})
            start = time.monotonic_ns()
            types.FunctionType(code, {"HOLD": hold})(HOLD_US)
            calls.append({"line": variants[i % 4][1] + shift, "code": [id(code), id(table)],
                          "start": start, "end": time.monotonic_ns()})
            del code, table
            time.sleep(0.002)

    since = time.monotonic_ns()
    threads = [threading.Thread(target=victim), threading.Thread(target=hog)]
    for t in threads:
        t.start()
    threads[1].join()
    stop.set()
    threads[0].join()
    holds, complete = ring.holds_since(since)
    assert complete, "the hold log wrapped during the run"
    for call in calls:
        mine = [h for h in holds if h.tid == threads[1].native_id and
                min(h.end_ns, call["end"]) - max(h.start_ns, call["start"]) >= HOLD_US * 1000]
        location = ring.location(mine[0].index) if mine else None
        call["logged"] = [list(f) for f in location.frames] if location else None
    inprocess.stop()
    return {"calls": calls}


if __name__ == "__main__":
    print(json.dumps(main()))

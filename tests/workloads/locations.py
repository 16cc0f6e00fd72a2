"""Where the GIL's holder was, against ground truth, written by both writers at once.

Usage: python locations.py SOCKET; prints one JSON document.

A hog thread keeps the GIL through ``ctypes.PyDLL`` calls (they do not release it) made
from functions of every kind: a method, a class method, a static method, a lambda, a
generator, a coroutine, a function 200 calls deep in recursion, with Latin-1, BMP and
astral (UCS-4) characters in the names and the file name, so that both string kinds a
writer copies are exercised. A victim thread waits meanwhile, so each of those holds ends
in a forced switch right after the call returns: the location at that release is the line
that made the call. Then a pure-Python loop holds the GIL in switch-interval slices.
The collector's probes and the in-process hooks each write their own ring of this process;
the report has every hold of the hog's thread from both, with its location, and the truth.
"""

from __future__ import annotations

import ctypes
import json
import sys
import threading
import time

from otel_gil import ring as ringlib
from otel_gil.client import Registration
from otel_gil.inprocess import InProcess

FILE = "/srv/módulo_統計_🐍/lieu.py"  # never opened: a code object's file is the name it was compiled with
HOLD_US = 20_000  # the victim's drop request (5 ms into its wait) lands inside the call even when its wake-up is late
CALLS = 5  # per case
DEPTH = 200
SPIN_S = 0.15
SOURCE = '''\
class Ünïcode:
    def 計算(self, us):
        HOLD(us)  # HOLD Ünïcode.計算
        return us

    @classmethod
    def klass(cls, us):
        HOLD(us)  # HOLD Ünïcode.klass
        return us

    @staticmethod
    def static(us):
        HOLD(us)  # HOLD Ünïcode.static
        return us


def 𠀋𠀌(us):
    HOLD(us)  # HOLD 𠀋𠀌
    return us


lam = lambda us: HOLD(us)  # HOLD lam


def gen(us):
    HOLD(us)  # HOLD gen
    yield us


async def coro(us):
    HOLD(us)  # HOLD coro
    return us


def deep(n, us):
    if n:
        return deep(n - 1, us)  # RECURSE
    HOLD(us)  # HOLD deep
    return us


def spin(seconds, clock):
    end = clock() + seconds
    while clock() < end:  # SPIN
        pass  # SPIN
'''


def _line(marker: str) -> int:
    return next(i for i, text in enumerate(SOURCE.splitlines(), 1) if text.endswith(marker))


def _cases(ns: dict) -> dict:
    """case -> (a call of it, the code object it holds the GIL in)."""
    def run_coro(us: int) -> None:
        try:
            ns["coro"](us).send(None)
        except StopIteration:
            pass

    instance = ns["Ünïcode"]()
    return {
        "Ünïcode.計算": (instance.計算, ns["Ünïcode"].計算.__code__),
        "Ünïcode.klass": (ns["Ünïcode"].klass, ns["Ünïcode"].klass.__func__.__code__),
        "Ünïcode.static": (ns["Ünïcode"].static, ns["Ünïcode"].static.__code__),
        "𠀋𠀌": (ns["𠀋𠀌"], ns["𠀋𠀌"].__code__),
        "lam": (ns["lam"], ns["lam"].__code__),
        "gen": (lambda us: next(ns["gen"](us)), ns["gen"].__code__),
        "coro": (run_coro, ns["coro"].__code__),
        "deep": (lambda us: ns["deep"](DEPTH, us), ns["deep"].__code__),
    }


def _name(code) -> str:
    """The function's name as the writers read it: the qualified name where code objects have one (3.11+)."""
    return getattr(code, "co_qualname", code.co_name)


def _holds(ring: ringlib.Ring, tid: int, since_ns: int) -> list[dict]:
    holds, complete = ring.holds_since(since_ns)
    assert complete, "the hold log wrapped during the run"
    found = []
    for hold in holds:
        if hold.tid != tid:
            continue
        location = ring.location(hold.index)
        found.append({"start": hold.start_ns, "end": hold.end_ns,
                      "frames": [list(f) for f in location.frames] if location else None,
                      "missing": list(location.missing) if location else ["gone"]})
    return found


def main(socket_path: str) -> dict:
    registration = Registration(socket_path)
    registration.start()
    registration.wait(30)
    assert registration.state.status == "ok", registration.state.detail
    inprocess = InProcess()
    inprocess.start()
    assert inprocess.state.status == "ok", inprocess.state.detail
    deadline = time.monotonic() + 10
    while not registration.state.ring.header.switch_cond and time.monotonic() < deadline:
        time.sleep(0.01)  # the collector learns the GIL from a take_gil of ours

    ns: dict = {"HOLD": ctypes.PyDLL(None).usleep}
    exec(compile(SOURCE, FILE, "exec"), ns)
    cases, truth, stop = _cases(ns), [], threading.Event()

    def victim() -> None:
        while not stop.is_set():
            time.sleep(0.0005)

    def hog() -> None:
        time.sleep(0.01)
        for name, (call, code) in cases.items():
            for _ in range(CALLS):
                t0 = time.monotonic_ns()
                call(HOLD_US)
                truth.append({"case": name, "start": t0, "end": time.monotonic_ns(), "function": _name(code),
                              "line": _line(f"# HOLD {name}")})
                time.sleep(0.002)
        t0 = time.monotonic_ns()
        ns["spin"](SPIN_S, time.monotonic)
        truth.append({"case": "spin", "start": t0, "end": time.monotonic_ns(), "function": _name(ns["spin"].__code__),
                      "lines": [i for i, text in enumerate(SOURCE.splitlines(), 1) if text.endswith("# SPIN")]})

    since = time.monotonic_ns()
    threads = [threading.Thread(target=victim, name="victim"), threading.Thread(target=hog, name="hog")]
    for t in threads:
        t.start()
    threads[1].join()
    stop.set()
    threads[0].join()
    time.sleep(0.01)
    report = {
        "version": list(sys.version_info[:2]), "file": FILE, "hold_us": HOLD_US, "truth": truth, "recurse_line": _line("# RECURSE"),
        "deep_function": _name(ns["deep"].__code__), "driver": [_name(hog.__code__), hog.__code__.co_filename],
        "writers": {kind: {"holds": _holds(ring, threads[1].native_id, since),
                           "misses": dict(zip(ringlib.LOC_WHY_NAMES, ring.header.location_misses))}
                    for kind, ring in (("collector", registration.state.ring), ("inprocess", inprocess.state.ring))},
    }
    registration.stop()
    inprocess.stop()
    return report


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1]), ensure_ascii=False))

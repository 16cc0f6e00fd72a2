"""What the ground-truth web apps share (tests/e2e/test_async_servers.py runs them under
opentelemetry-instrument on real servers): each request times its own code and answers it,
its pure-Python pieces (they run between its switches) and its PyDLL holds (own_time.py says
how each is timed). A hog thread outside any request holds the GIL through PyDLL when asked,
and keeps the wall-clock times of its holds, for the loop's waits.
"""

from __future__ import annotations

import ctypes
import threading
import time

from own_time import Held, clock, pydll_hold, since, spin, total  # noqa: F401 (re-exported: the apps' truth)

PIECE_MS = 30  # each pure-Python piece; three a request: the framework's own code per request (ASGI middleware,
# its spans, routing, the response: 1-2 ms on a 2-core VM) is in the server span, not in the truth
_gil_holding_libc = ctypes.PyDLL(None)

# Why routes that run in threads (20 of them at once, one a request) hold the GIL through PyDLL
# rather than in pure Python: a thread made to drop the GIL that finds it taken by more than the
# one it let in, by the time it asks again (on 2 CPUs shared by 20 threads, often), gets its wait
# counted from its asking (gil_writer.h, STALE_CHECK): the stretch before is neither its hold nor
# its wait, so a pure-Python piece's wall time less its waits is no truth there.
THREADED = True


def answer(held: Held, **more) -> dict:
    """A request's answer: its truth (own_time.Held) as ``own_ns`` and ``cpu_ns``."""
    return {"own_ns": held.ns, "cpu_ns": held.cpu_ns, **more}


class Hog:
    """A thread outside any request that holds the GIL 3 ms at a time, 2 ms apart, while on."""

    def __init__(self) -> None:
        self.holds: list[tuple[int, int]] = []  # wall clock ns: each hold and the Python around it
        self._on = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.holds.clear()
        self._on.set()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="gil-hog", daemon=True)
            self._thread.start()

    def stop(self) -> list[tuple[int, int]]:
        self._on.clear()
        time.sleep(0.02)
        return list(self.holds)

    def _run(self) -> None:
        while True:
            self._on.wait()
            t0 = time.time_ns()
            _gil_holding_libc.usleep(3000)
            self.holds.append((t0, time.time_ns()))
            time.sleep(0.002)


hog = Hog()

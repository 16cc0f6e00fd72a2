"""A free-threaded process (no otel_gil) for ``otel-gil report``'s parked time (its GIL off) and
GIL figures (``PYTHON_GIL=1``).

Usage: python report_parks.py HOLD_MS. Prints ``ready {role: native tid}``, waits for SIGUSR1
(sent once the report captures), then, from its main thread:

- holds a ``threading.Lock`` for HOLD_MS while thread ``lock-victim`` acquires it;
- sorts a shared list with a key that stays attached for HOLD_MS (a ``ctypes.PyDLL`` usleep:
  the list's critical section held, and the GIL if on) while ``list-victim`` appends to it;
- runs ``gc.collect()`` over a large heap while ``stw-victim`` reads the clock in a loop: the gaps
  between its reads over 1 ms (``stw_gaps``, summed) hold the stop-the-world pause it was
  suspended for, the longest of them (``stw_pause``) is that pause unless the kernel preempted
  the victim in it (``stw_preempted``: its involuntary context switches in it).

Prints each victim's wait, the key's PyDLL call (``sort_held``), monotonic ns timed around each,
and lives until its stdin closes. The victims wait for their turn with time.sleep (no park).
"""

from __future__ import annotations

import ctypes
import gc
import json
import resource
import signal
import sys
import threading
import time

_usleep = ctypes.PyDLL(None).usleep  # PyDLL: the caller stays attached, holding what it holds
hold_ms = int(sys.argv[1])
lock, shared, truth, ids = threading.Lock(), list(range(1000)), {}, {}
turn = {"lock": False, "list": False, "stw": False}
heap = [[i, str(i)] for i in range(hold_ms * 5000)]  # containers the collection visits
collected = threading.Event()


def victim(role: str, wait) -> None:
    ids[role] = threading.get_native_id()
    while not turn[role]:
        time.sleep(0.002)
    time.sleep(0.02)  # the other side holds it by now
    t0 = time.monotonic_ns()
    wait()
    truth[role] = time.monotonic_ns() - t0
    while True:  # alive (its slot read) until the process ends
        time.sleep(1)


def acquire() -> None:
    with lock:
        pass


def count() -> None:
    """Clock reads until the collection is over: the gaps over 1 ms between them."""
    last, last_switches = time.monotonic_ns(), resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw
    gaps, longest = 0, (0, 0)
    while True:
        over = collected.is_set()  # read before the step: the step after the pause still counts
        now, switches = time.monotonic_ns(), resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw
        if now - last > 1_000_000:
            gaps += now - last
            longest = max(longest, (now - last, switches - last_switches))
        last, last_switches = now, switches
        if over:
            break
    truth["stw_gaps"], (truth["stw_pause"], truth["stw_preempted"]) = gaps, longest


def key(x: int) -> int:
    if x == 0:
        turn["list"] = True
        t0 = time.monotonic_ns()
        _usleep(hold_ms * 1000)
        truth["sort_held"] = time.monotonic_ns() - t0
    return x


signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
for role, wait in (("lock", acquire), ("list", lambda: shared.append(1)), ("stw", count)):
    threading.Thread(target=victim, args=(role, wait), name=f"{role}-victim", daemon=True).start()
while len(ids) < 3:
    time.sleep(0.001)
print("ready", json.dumps(ids), flush=True)
signal.sigwait({signal.SIGUSR1})
with lock:
    turn["lock"] = True
    time.sleep(hold_ms / 1000)
while "lock" not in truth:
    time.sleep(0.001)
shared.sort(key=key)
while "list" not in truth:  # with the GIL on (PYTHON_GIL=1), the sort held it: sort_held
    time.sleep(0.001)
turn["stw"] = True
time.sleep(0.05)  # the victim counts by now
gc.collect()
collected.set()
while "stw" not in truth:
    time.sleep(0.001)
print(json.dumps(truth), flush=True)
sys.stdin.read()

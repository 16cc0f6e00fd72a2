"""A free-threaded process (no otel_gil) for ``otel-gil report``'s parked time (its GIL off) and
GIL figures (``PYTHON_GIL=1``).

Usage: python report_parks.py HOLD_MS. Prints ``ready {role: native tid}``, waits for SIGUSR1
(sent once the report captures), then: the main thread holds a ``threading.Lock`` for HOLD_MS
while thread ``lock-victim`` acquires it; then sorts a shared list with a key that stays attached
for HOLD_MS (a ``ctypes.PyDLL`` usleep: the list's critical section held, and the GIL if on)
while thread ``list-victim`` appends to it. Prints each victim's wait and the key's PyDLL call
(``sort_held``), monotonic ns timed around each, and lives until its stdin closes. The victims
wait for their turn with time.sleep (no park).
"""

from __future__ import annotations

import ctypes
import json
import signal
import sys
import threading
import time

_usleep = ctypes.PyDLL(None).usleep  # PyDLL: the caller stays attached, holding what it holds
hold_ms = int(sys.argv[1])
lock, shared, truth, turn = threading.Lock(), list(range(1000)), {}, {"lock": False, "list": False}
ids = {}


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


def key(x: int) -> int:
    if x == 0:
        turn["list"] = True
        t0 = time.monotonic_ns()
        _usleep(hold_ms * 1000)
        truth["sort_held"] = time.monotonic_ns() - t0
    return x


signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
for role, wait in (("lock", acquire), ("list", lambda: shared.append(1))):
    threading.Thread(target=victim, args=(role, wait), name=f"{role}-victim", daemon=True).start()
while len(ids) < 2:
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
print(json.dumps(truth), flush=True)
sys.stdin.read()

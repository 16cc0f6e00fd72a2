"""A process for `otel-gil report`/`top` to attach to (no otel_gil inside): on SIGUSR1 a
hog thread holds the GIL in known bursts (ctypes.PyDLL) right after waking two I/O
threads, 100 ms apart; prints the truth as JSON, then idles until killed.

Usage: report_target.py [BURSTS]  (default 10)"""

import ctypes
import json
import os
import signal
import sys
import threading
import time

libc = ctypes.PyDLL(None)
go = threading.Event()
# SIGUSR1 goes to main's sigwait: blocked before any thread starts (they inherit the mask), or
# the kernel could deliver it to a thread blocked in read() while main never runs the handler.
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
pipes = [os.pipe(), os.pipe()]
truth = {"hog_hold_ns": 0, "io_wait_ns": [0, 0], "tids": {}, "bursts": []}  # bursts: [start, end] monotonic ns
# threading names by role: one past /proc's 15 characters and not ASCII (each string layout is read)
NAMES = {"hog": "gil-hog", "io-0": "io-0", "io-1": "io-1-ünïcode-名前-longer-than-15"}
BURSTS, BURST_US = int(sys.argv[1]) if len(sys.argv) > 1 else 10, 50_000
done = threading.Event()
forever = threading.Event()  # threads stay alive (and keep their slots) until the process is killed
started = threading.Barrier(4)  # the three threads and main: all tids are known


def io(i: int) -> None:
    truth["tids"][f"io-{i}"] = threading.get_native_id()
    started.wait()
    for _ in range(BURSTS):
        os.read(pipes[i][0], 1)
    forever.wait()


def hog() -> None:
    truth["tids"]["hog"] = threading.get_native_id()
    started.wait()
    go.wait()
    for _ in range(BURSTS):
        t_write = time.monotonic_ns()
        for _, w in pipes:
            libc.write(w, b"x", 1)
        t0, line = time.monotonic_ns(), sys._getframe().f_lineno + 1
        libc.usleep(BURST_US)  # the hold ends right after (the I/O threads wait): where it was
        t1 = time.monotonic_ns()
        code = sys._getframe().f_code
        truth["hog_code"] = [getattr(code, "co_qualname", code.co_name), code.co_filename, line]
        truth["hog_hold_ns"] += t1 - t0
        truth["bursts"].append([t0, t1])
        for i in range(2):
            truth["io_wait_ns"][i] += t1 - t_write
        time.sleep(0.1)
    done.set()
    forever.wait()


threads = [threading.Thread(target=hog, name=NAMES["hog"])] + [
    threading.Thread(target=io, args=(i,), name=NAMES[f"io-{i}"]) for i in range(2)
]
for t in threads:
    t.start()
started.wait()
truth["names"] = NAMES
print("ready", json.dumps(truth["tids"]), flush=True)
signal.sigwait({signal.SIGUSR1})
go.set()
done.wait()
time.sleep(0.2)
print(json.dumps(truth), flush=True)
forever.wait()

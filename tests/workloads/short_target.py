"""A process for `otel-gil report` (no otel_gil inside) whose GIL is held by threads that end
within the capture: on SIGUSR1, threads named short-hog-0, 1, 2, one after the other, each wake an
I/O thread and hold the GIL 150 ms (ctypes.PyDLL), then end; prints the truth as JSON, then
idles until killed."""

import ctypes
import json
import os
import signal
import threading
import time

HOGS, BURST_US = 3, 150_000
libc = ctypes.PyDLL(None)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})  # for main's sigwait (report_target.py says why)
r, w = os.pipe()
truth = {"hogs": {}, "io": None}


def io() -> None:
    truth["io"] = threading.get_native_id()
    for _ in range(HOGS):
        os.read(r, 1)
    threading.Event().wait()


def hog() -> None:
    truth["hogs"][threading.current_thread().name] = threading.get_native_id()
    libc.write(w, b"x", 1)
    libc.usleep(BURST_US)


threading.Thread(target=io, name="io", daemon=True).start()
print("ready", flush=True)
signal.sigwait({signal.SIGUSR1})
for i in range(HOGS):
    thread = threading.Thread(target=hog, name=f"short-hog-{i}")
    thread.start()
    thread.join()
    time.sleep(0.1)
print(json.dumps(truth), flush=True)
threading.Event().wait()

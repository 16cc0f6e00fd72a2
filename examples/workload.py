"""What the example services do, shared by the Flask and Django apps.

The culprit of "Is it me, or the GIL?": a background ``metrics-collector`` thread
that, on a timer, crunches numbers in pure Python and so holds the GIL. Every
request thread that blocks on I/O must then wait for the GIL to come back.

Environment: ``EXAMPLE_GIL_HOG=0`` switches the hog off; ``EXAMPLE_HOG_BUSY_MS``
(default 40) and ``EXAMPLE_HOG_PERIOD_MS`` (default 50) shape it.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time

_hog_pid = 0
_hog_lock = threading.Lock()
_gil_holding_libc = ctypes.PyDLL(None)  # calls through PyDLL keep the GIL


def _env_ms(name: str, default: float) -> float:
    return float(os.environ.get(name, default)) / 1000


def _metrics_collector() -> None:
    busy, period = _env_ms("EXAMPLE_HOG_BUSY_MS", 40), _env_ms("EXAMPLE_HOG_PERIOD_MS", 50)
    while True:
        start = time.monotonic()
        total = 0
        while time.monotonic() - start < busy:  # "aggregating metrics": pure Python
            total += sum(i * i for i in range(200))
        time.sleep(max(period - busy, 0.001))


def ensure_hog() -> None:
    """Start the hog once per process (a forked worker starts its own)."""
    global _hog_pid
    if os.environ.get("EXAMPLE_GIL_HOG", "1") == "0" or _hog_pid == os.getpid():
        return
    with _hog_lock:
        if _hog_pid != os.getpid():
            threading.Thread(target=_metrics_collector, name="metrics-collector", daemon=True).start()
            _hog_pid = os.getpid()


def io_bound() -> str:
    """Ten short blocking waits (like small DB queries): each gives the GIL up."""
    for _ in range(10):
        time.sleep(0.002)
    return "io done"


def cpu_bound() -> str:
    """About 20 ms of pure-Python work."""
    start, n = time.monotonic(), 0
    while time.monotonic() - start < 0.02:
        n += sum(i * i for i in range(100))
    return f"cpu done ({n})"


def slow_c() -> str:
    """A slow C call that does not release the GIL (20 ms)."""
    _gil_holding_libc.usleep(20_000)
    return "slow C call done"

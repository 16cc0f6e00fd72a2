"""This process's threads by native id: names for spans and metrics, and the threads
started since the metrics last looked (a thread may start and exit between two reads)."""

from __future__ import annotations

import threading
from typing import Optional

import wrapt

_MAX_STARTS = 4096  # bounds the log when no metric reader drains it
_starts: list[threading.Thread] = []  # threads started since take_starts()


def live() -> dict[int, threading.Thread]:
    """The live Python threads, by native (kernel) thread id."""
    return {t.native_id: t for t in threading.enumerate() if t.native_id is not None}


def name(tid: int, known: dict[int, threading.Thread]) -> Optional[str]:
    """The thread's ``threading`` name, else its kernel name (/proc), else None."""
    thread = known.get(tid)
    found = thread.name if thread is not None else None
    if found is None:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                found = f.read().strip() or None
        except OSError:
            pass
    return found


def _log_start(wrapped, instance: threading.Thread, args, kwargs):
    # Logged before it runs: a reader that sees the thread's slot finds its name already.
    if len(_starts) < _MAX_STARTS:
        _starts.append(instance)
    try:
        return wrapped(*args, **kwargs)
    except BaseException:
        if instance in _starts:
            _starts.remove(instance)
        raise


def watch_starts() -> None:
    """Log every ``threading.Thread.start`` from now on (see :func:`take_starts`)."""
    if not hasattr(threading.Thread.start, "__wrapped__"):
        wrapt.wrap_function_wrapper(threading.Thread, "start", _log_start)


def unwatch_starts() -> None:
    """Undo :func:`watch_starts`."""
    start = threading.Thread.__dict__["start"]
    if hasattr(start, "__wrapped__"):
        threading.Thread.start = start.__wrapped__
    _starts.clear()


def take_starts() -> dict[int, str]:
    """Names of the threads started since the last call, by native id (then forgets them;
    a thread not running yet is kept for the next call)."""
    global _starts
    taken, _starts = _starts, []
    started = {}
    for thread in taken:
        if thread.native_id is not None:
            started[thread.native_id] = thread.name
        elif len(_starts) < _MAX_STARTS:
            _starts.append(thread)
    return started

"""This process's threads by native (kernel) id: who held an id at a given time, for the
blockers spans name (a blocker may have ended before the span did, and its id may belong
to another thread since), and the threads started since the metrics last looked.

Threads are known from ``threading.enumerate()`` when watching starts and from every
``threading.Thread.start`` after (:func:`watch_starts`, beside any other wrapper of it).
The kernel gives an ended thread's id to a later thread, so an id has a succession of
owners: each known one is kept with when it could have begun (its ``start()`` was
called), when it surely ran (``start()`` returned) and, once seen ended, by when it had
ended. :func:`owner` names an id over a stretch of time only if exactly one owner could
have held it then; otherwise nobody (a name is never given to another thread).
"""

from __future__ import annotations

import collections
import os
import threading
import time
from dataclasses import dataclass
from typing import Optional

from otel_gil import wrappers

_MAX_STARTS = 4096  # bounds the start log when no metric reader drains it
MEMORY = 4096  # ended threads remembered, most recently ended kept
_starts: list[threading.Thread] = []  # threads started since take_starts()
_memory: Optional["_Memory"] = None  # the known owners of kernel ids, while watching
_TICK_NS = 10**9 // os.sysconf("SC_CLK_TCK")  # /proc's unit of a task's start time


@dataclass
class _Owner:
    """A thread's tenure of its kernel id, as far as known (monotonic ns)."""

    since_ns: int  # it did not exist before
    running_ns: int  # it existed by then
    thread: Optional[threading.Thread]  # None once ended (or not a threading thread)
    ident: Optional[int] = None  # thread.id and name: read from ``thread`` while it lives
    name: Optional[str] = None
    ended_ns: Optional[int] = None  # it had ended by then

    def who(self) -> tuple[Optional[int], Optional[str]]:
        return (self.ident, self.name) if self.thread is None else (self.thread.ident, self.thread.name)

    def ended(self) -> bool:
        return self.thread is None or not self.thread.is_alive()


class _Memory:
    """The known owners of each kernel id, in order; ended ones past :data:`MEMORY` forgotten."""

    def __init__(self, now_ns: int) -> None:
        self.owners: dict[int, list[_Owner]] = {}
        self._ended: collections.deque[tuple[int, _Owner]] = collections.deque()
        self.horizon_ns = now_ns  # owners before it may be unknown: forgotten, or gone before watching
        self._open, self._sweep_at = 0, 64  # owners not seen ended; sweep when this many
        self._sweeping = threading.Lock()
        for thread in threading.enumerate():  # (a dummy may outlive its thread before 3.13: not one)
            if thread.native_id is not None and not isinstance(thread, threading._DummyThread):
                self.add(thread.native_id, _Owner(0, now_ns, thread))

    def add(self, tid: int, owner: _Owner) -> None:
        owners = self.owners.setdefault(tid, [])
        if owners and not owners[-1].ended():
            return  # runs on a live thread's kernel thread (a greenlet, under gevent): not an owner
        owners.append(owner)
        self._open += 1
        if self._open >= self._sweep_at:
            self.sweep()

    def sweep(self) -> None:
        """Settle the owners that ended (their name and id are final), forget the oldest."""
        if not self._sweeping.acquire(blocking=False):
            return  # another thread sweeps
        try:
            now, still_open = time.monotonic_ns(), 0
            for tid, owners in list(self.owners.items()):
                for o in owners:
                    if o.thread is None:
                        continue
                    if o.thread.is_alive():
                        still_open += 1
                        continue
                    o.ident, o.name, o.thread, o.ended_ns = o.thread.ident, o.thread.name, None, now
                    self._ended.append((tid, o))
            while len(self._ended) > MEMORY:  # a kernel id's owners end in order: its first goes
                tid, o = self._ended.popleft()
                owners = self.owners[tid]
                owners.remove(o)
                if not owners:
                    del self.owners[tid]
                self.horizon_ns = max(self.horizon_ns, o.ended_ns)
            self._open, self._sweep_at = still_open, max(64, 2 * still_open)
        finally:
            self._sweeping.release()


def _task_owner(tid: int) -> Optional[_Owner]:
    """The thread that has kernel id ``tid`` now, with when it began (from /proc, to a
    tick) and its ``threading`` name, else its kernel name; None if there is none."""
    try:
        with open(f"/proc/self/task/{tid}/stat") as f:
            stat = f.read()
        with open(f"/proc/self/task/{tid}/comm") as f:
            comm = f.read().strip() or None
    except OSError:
        return None
    boot_minus_mono = time.clock_gettime_ns(time.CLOCK_BOOTTIME) - time.monotonic_ns()
    since = int(stat[stat.rindex(")") + 2:].split()[19]) * _TICK_NS - boot_minus_mono  # field 22: starttime
    thread = live().get(tid)
    return _Owner(since, since + _TICK_NS, None, getattr(thread, "ident", None), getattr(thread, "name", comm))


def owner(tid: int, start_ns: int, end_ns: int) -> tuple[Optional[int], Optional[str]]:
    """(thread.id, name) of the thread that had kernel id ``tid`` from ``start_ns`` to ``end_ns``
    (CLOCK_MONOTONIC), even if it has ended since; each None where not known for sure."""
    memory = _memory
    owners = list(memory.owners.get(tid, ())) if memory is not None else []
    # Owners before the first one known may be unknown: forgotten or gone before watching
    # (until the horizon), any thread before the one /proc shows (no owner known).
    horizon = memory.horizon_ns if owners else end_ns + 1
    if not owners:
        # A live thread whose start was not seen (a dummy, a _thread one) is the one it
        # names; else one threading never knew (started from C): /proc, only for those.
        # Each read lets the GIL go, and under contention a span's end waits out a switch
        # interval per read: a read per ended blocker cost the soak's loop nine in ten of
        # its spans' figures.
        thread = live().get(tid)
        later = _Owner(0, 0, thread) if thread is not None else _task_owner(tid)
        if later is None:
            return None, None
        owners.append(later)
    last = owners[-1]
    if last.ended_ns is not None and end_ns >= last.ended_ns:
        return None, None  # past its seen end: a thread threading never knew may have had it since
    could = _could(owners, start_ns, end_ns)
    unknown = start_ns < owners[0].running_ns and start_ns < horizon
    return could[0].who() if len(could) == 1 and not unknown else (None, None)


def _could(owners: list[_Owner], start_ns: int, end_ns: int) -> list[_Owner]:
    """The owners that may have had the id from ``start_ns`` to ``end_ns``."""
    return [o for i, o in enumerate(owners)
            if o.since_ns <= end_ns and (o.ended_ns is None or start_ns < o.ended_ns)
            and (i + 1 == len(owners) or start_ns < owners[i + 1].running_ns)]


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
    memory = _memory
    if memory is None:  # unwatched, but left inside another library's wrapper
        return wrapped(*args, **kwargs)
    since = time.monotonic_ns()
    # Logged before it runs: a reader that sees the thread's slot finds its name already.
    if len(_starts) < _MAX_STARTS:
        _starts.append(instance)
    try:
        result = wrapped(*args, **kwargs)
    except BaseException:
        if instance in _starts:
            _starts.remove(instance)
        raise
    if instance.native_id is not None:
        memory.add(instance.native_id, _Owner(since, time.monotonic_ns(), instance))
    return result


def watch_starts() -> None:
    """Log every ``threading.Thread.start`` from now on (see :func:`take_starts`, :func:`owner`):
    one wrapper of ours, outermost or inside others'."""
    global _memory
    _memory = _Memory(time.monotonic_ns())
    wrappers.wrap(threading.Thread, "start", _log_start)


def unwatch_starts() -> None:
    """Undo :func:`watch_starts`: take our wrapper out of ``Thread.start``'s chain, leaving
    other libraries' wrappers as they are (one that cannot be re-pointed keeps ours, idle)."""
    global _memory
    _memory = None
    wrappers.unwrap(threading.Thread, "start", _log_start)
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

"""This process's threads by native (kernel) id: who held an id at a given time, for the
blockers spans name (a blocker may have ended before the span did, and its id may belong
to another thread since), and the threads started since the metrics last looked.

Threads are known from ``threading.enumerate()`` when watching starts and from every
``threading.Thread.start`` after (:func:`watch_starts`, beside any other wrapper of it).
The kernel gives an ended thread's id to a later thread, so an id has a succession of
owners: each known one is kept with when it could have begun (its ``start()`` was
called), when it surely ran (``start()`` returned) and, once seen ended (a later thread
got its id, or its Thread was freed), by when it had ended. :func:`owner` names an id over
a stretch of time only if exactly one owner could have held it then; otherwise nobody (a
name is never given to another thread). A thread whose start was not seen is named from
when /proc says its task began; before 3.13 a dummy (a thread started from C) by its kernel
name: threading keeps a dummy after its thread ended, with the ended one's name.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Optional

from otel_gil import wrappers

_MAX_STARTS = 4096  # bounds the start log when no metric reader drains it
MEMORY = 4096  # ended threads remembered, most recently ended kept
_starts: list["_Owner"] = []  # threads started since take_starts()
_memory: Optional["_Memory"] = None  # the known owners of kernel ids, while watching
_TICK_NS = 10**9 // os.sysconf("SC_CLK_TCK")  # /proc's unit of a task's start time
_DUMMIES_END = sys.version_info >= (3, 13)  # threading drops a dummy as its thread ends (before: never)


def _alive(thread: threading.Thread) -> bool:
    """Whether ``thread`` runs; a dummy before 3.13 may have ended unseen: taken as ended."""
    if isinstance(thread, threading._DummyThread) and not _DUMMIES_END:
        return False
    try:
        return thread.is_alive()
    except RuntimeError:  # a dummy whose thread ended (3.13+)
        return False


@dataclass(eq=False)
class _Owner:
    """A thread's tenure of its kernel id, as far as known (monotonic ns). The thread itself
    is only weakly referenced: an ended one's objects (an executor's work queue) are freed."""

    tid: Optional[int]  # None until its start() returned
    since_ns: int  # it did not exist before
    running_ns: int  # it existed by then
    ident: Optional[int]  # thread.id and name: the last read of them
    name: Optional[str]
    ref: Optional[weakref.ref] = None  # the Thread, until settled
    ended_ns: Optional[int] = None  # it had ended by then

    def who(self) -> tuple[Optional[int], Optional[str]]:
        thread = self.ref() if self.ref is not None else None
        if thread is not None:  # follows renames while its Thread lives
            self.ident, self.name = thread.ident, thread.name
        return self.ident, self.name


def _owner_of(thread: threading.Thread, since_ns: int, running_ns: int, freed: collections.deque) -> _Owner:
    """An owner for ``thread``; once the Thread is freed, (owner, when) goes to ``freed``."""
    owner = _Owner(thread.native_id, since_ns, running_ns, thread.ident, thread.name)
    owner.ref = weakref.ref(thread, lambda _, now=time.monotonic_ns: freed.append((owner, now())))
    return owner


class _Memory:
    """The known owners of each kernel id, in order; ended ones past :data:`MEMORY` forgotten.
    An owner is settled (its end known) when a later thread gets its id or its Thread is freed:
    no sweep over the owners, no cost beyond O(1) in the app's ``Thread.start``. ``generation``
    changes with every change of ``owners`` and of what a settled owner says (long_waits.c keeps
    what it read of them while it is the same)."""

    def __init__(self, now_ns: int) -> None:
        self.owners: dict[int, list[_Owner]] = {}
        self._ended: collections.deque[_Owner] = collections.deque()
        self.freed: collections.deque[tuple[_Owner, int]] = collections.deque()  # by weakref callbacks: no lock
        self.horizon_ns = now_ns  # owners before it may be unknown: forgotten, or gone before watching
        self.generation = 0
        self._lock = threading.Lock()
        for thread in threading.enumerate():  # (a dummy may outlive its thread before 3.13: not one)
            if thread.native_id is not None and not isinstance(thread, threading._DummyThread):
                self.add(_owner_of(thread, 0, now_ns, self.freed))

    def add(self, owner: _Owner) -> None:
        with self._lock:
            self._settle_freed()
            owners = self.owners.setdefault(owner.tid, [])
            if owners and owners[-1].ended_ns is None:  # a later thread has its id: it had ended
                self._settle(owners[-1], time.monotonic_ns())
            owners.append(owner)
            self.generation += 1

    def known(self, tid: int) -> list[_Owner]:
        """``tid``'s owners, oldest first, the freed ones settled."""
        if self.freed:
            with self._lock:
                self._settle_freed()
        return list(self.owners.get(tid, ()))

    def _settle_freed(self) -> None:
        while self.freed:
            owner, when = self.freed.popleft()
            self._settle(owner, when)

    def _settle(self, owner: _Owner, when: int) -> None:
        """``owner`` had ended by ``when``: its name and id are final; forget the oldest ended."""
        if owner.ended_ns is not None or owner not in self.owners.get(owner.tid, ()):
            return
        owner.who()
        owner.ref, owner.ended_ns = None, when
        self._ended.append(owner)
        while len(self._ended) > MEMORY:  # a kernel id's owners end in order: its first goes
            gone = self._ended.popleft()
            owners = self.owners[gone.tid]
            owners.remove(gone)
            if not owners:
                del self.owners[gone.tid]
            self.horizon_ns = max(self.horizon_ns, gone.ended_ns)
        self.generation += 1  # last: a reader between two bytecodes above kept what it read under the one before


def _task_owner(tid: int) -> Optional[_Owner]:
    """The thread that has kernel id ``tid`` now, with when it began (from /proc, to a
    tick) and its ``threading`` name (a Thread running with that id; before 3.13 a dummy's
    may be an ended thread's), else its kernel name; None if there is none."""
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
    if thread is None or not _alive(thread):
        return _Owner(tid, since, since + _TICK_NS, None, comm)
    return _Owner(tid, since, since + _TICK_NS, thread.ident, thread.name)


def owner(tid: int, start_ns: int, end_ns: int) -> tuple[Optional[int], Optional[str]]:
    """(thread.id, name) of the thread that had kernel id ``tid`` from ``start_ns`` to ``end_ns``
    (CLOCK_MONOTONIC), even if it has ended since; each None where not known for sure."""
    memory = _memory
    owners = memory.known(tid) if memory is not None else []
    # Owners before the first one known may be unknown: forgotten or gone before watching
    # (until the horizon), any thread before the one /proc shows (no owner known).
    horizon = memory.horizon_ns if owners else end_ns + 1
    if not owners:
        # The thread that has the id now, named only since /proc says its task began. A live
        # Thread whose start was not seen (a dummy, a _thread one) is remembered (one read
        # each: each lets the GIL go, and under contention a span's end waits out a switch
        # interval per read); one threading never knew is read again at each call.
        later = _task_owner(tid)
        if later is None:
            return None, None
        thread = live().get(tid)
        if thread is not None and memory is not None and _alive(thread):
            remembered = _owner_of(thread, later.since_ns, later.running_ns, memory.freed)
            memory.add(remembered)
            later = remembered
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
    started = _owner_of(instance, since, since, memory.freed)
    if len(_starts) < _MAX_STARTS:
        _starts.append(started)
    try:
        result = wrapped(*args, **kwargs)
    except BaseException:
        if started in _starts:
            _starts.remove(started)
        raise
    if instance.native_id is not None:
        started.tid, started.running_ns = instance.native_id, time.monotonic_ns()
        started.who()  # its ident, now known
        if instance.native_id != threading.get_native_id():  # (else a greenlet on ours, under gevent)
            memory.add(started)
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
        if thread.tid is not None:
            started[thread.tid] = thread.who()[1]
        elif thread.ref is not None and thread.ref() is not None and len(_starts) < _MAX_STARTS:
            _starts.append(thread)
    return started

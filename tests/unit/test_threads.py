"""otel_gil.threads: its wrapper of Thread.start beside the threading instrumentation's (the
real one, wrapt), in either order and every undo order; and who a kernel tid was over a
stretch of time: real threads that ended, and synthetic successions of owners (tid reuse)."""

import _thread
import gc
import json
import os
import subprocess
import sys
import threading
import time
import weakref

import pytest
from opentelemetry.instrumentation.threading import ThreadingInstrumentor

from helpers import ROOT
from otel_gil import threads

ORIGINAL = threading.Thread.__dict__["start"]


def _chain() -> list:
    """Thread.start's wrappers, outermost first, down to the function."""
    chain, current = [], threading.Thread.__dict__["start"]
    while current is not None:
        chain.append(current)
        current = getattr(current, "__wrapped__", None)
    return chain


def _whose(chain: list) -> list[str]:
    """Who put each wrapper there: 'gil', 'threading', or the function itself."""
    return ["gil" if getattr(w, "_self_wrapper", None) is threads._log_start
            else "threading" if "threading_start" in getattr(getattr(w, "_self_wrapper", None), "__name__", "")
            else "function" for w in chain]


def _ran(name: str) -> threading.Thread:
    thread = threading.Thread(target=lambda: None, name=name)
    thread.start()
    thread.join()
    return thread


@pytest.fixture(autouse=True)
def undone():
    yield
    threads.unwatch_starts()
    ThreadingInstrumentor().uninstrument()
    threading.Thread.start = ORIGINAL  # whatever a failed test left


def _watch(first: str) -> None:
    for who in (first, "threading" if first == "gil" else "gil"):
        threads.watch_starts() if who == "gil" else ThreadingInstrumentor().instrument()


@pytest.mark.parametrize("first", ["gil", "threading"])
@pytest.mark.parametrize("undo_first", ["gil", "threading"])
def test_beside_the_threading_instrumentation(first, undo_first):
    _watch(first)
    assert sorted(_whose(_chain())) == ["function", "gil", "threading"]
    threads.take_starts()
    thread = _ran("short")
    assert threads.take_starts() == {thread.native_id: "short"}
    assert thread._otel_context is not None  # theirs ran too
    if undo_first == "gil":
        threads.unwatch_starts()
        assert _whose(_chain()) == ["threading", "function"]
        ThreadingInstrumentor().uninstrument()
    else:
        ThreadingInstrumentor().uninstrument()
        if first == "threading":  # their unwrap takes the outermost wrapper: ours, not theirs
            assert _whose(_chain()) == ["threading", "function"]
        else:
            assert _whose(_chain()) == ["gil", "function"]
        threads.unwatch_starts()  # leaves theirs (if ours went instead) where it is
        assert _whose(_chain()) == (["threading", "function"] if first == "threading" else ["function"])
        return
    assert threading.Thread.__dict__["start"] is ORIGINAL


def test_never_twice_and_again_after_another_removed_ours():
    threads.watch_starts()
    threads.unwatch_starts()
    threads.watch_starts()
    ThreadingInstrumentor().instrument()
    threads.watch_starts()  # ours is inside theirs: not wrapped again
    assert sorted(_whose(_chain())) == ["function", "gil", "threading"]
    threading.Thread.start = threading.Thread.__dict__["start"].__wrapped__  # another removes theirs... or ours
    threads.unwatch_starts()
    threads.watch_starts()
    assert _whose(_chain()).count("gil") == 1
    threads.take_starts()
    thread = _ran("again")
    assert threads.take_starts() == {thread.native_id: "again"}


def test_an_ended_thread_is_still_named_for_its_time():
    threads.watch_starts()
    before = time.monotonic_ns()
    thread = _ran("short-lived")
    after = time.monotonic_ns()
    deadline = time.monotonic() + 5
    while threads._task_owner(thread.native_id) is not None and time.monotonic() < deadline:
        time.sleep(0.001)  # the kernel let it go: nothing of it in /proc
    assert threads.owner(thread.native_id, before, after) == (thread.ident, "short-lived")
    tid, ident, freed = thread.native_id, thread.ident, weakref.ref(thread)
    del thread
    gc.collect()
    assert freed() is None  # nothing of ours kept it
    assert threads.owner(tid, before, after) == (ident, "short-lived")  # settled: its name kept without it
    assert threads.owner(tid, before - 10**9, before - 1) == (None, None)  # before it, unknown


def _owners(monkeypatch, tid: int, *owners: threads._Owner, horizon: int = 0, now=None) -> None:
    memory = threads._Memory(0)
    memory.owners[tid], memory.horizon_ns = list(owners), horizon
    monkeypatch.setattr(threads, "_memory", memory)
    monkeypatch.setattr(threads, "_task_owner", lambda t: now)


def _ended(since: int, running: int, ended: int, name: str) -> threads._Owner:
    return threads._Owner(7, since, running, hash(name), name, ended_ns=ended)


def test_a_reused_tid_names_only_the_thread_that_had_it(monkeypatch):
    """Synthetic owners of tid 7: a (started 100-110, seen ended at 800), b (started 600-700, seen
    ended at 900): a had ended by the time b ran, at 700 at the latest."""
    a, b = _ended(100, 110, 800, "a"), _ended(600, 700, 900, "b")
    _owners(monkeypatch, 7, a, b)
    assert threads.owner(7, 200, 400) == (hash("a"), "a")
    assert threads.owner(7, 650, 800) == (None, None)  # b may not have run yet at 650: a, or b
    assert threads.owner(7, 700, 800) == (hash("b"), "b")
    assert threads.owner(7, 400, 800) == (None, None)  # both held it in there
    assert threads.owner(7, 50, 90) == (None, None)  # before a: an owner not known
    assert threads.owner(7, 950, 990) == (None, None)  # b had ended: another thread since


def test_a_forgotten_owner_makes_the_first_known_uncertain(monkeypatch):
    b = _ended(600, 700, 900, "b")
    _owners(monkeypatch, 7, b, horizon=650)  # a thread ended by 650 was forgotten: it may have been tid 7
    assert threads.owner(7, 620, 800) == (None, None)
    assert threads.owner(7, 700, 800) == (hash("b"), "b")


def test_a_thread_not_known_named_from_proc_only_if_it_ran_through_the_window(monkeypatch):
    now = threads._Owner(7, 300, 310, None, "c-thread")
    _owners(monkeypatch, 7, now=now)
    assert threads.owner(7, 320, 400) == (None, "c-thread")
    assert threads.owner(7, 305, 400) == (None, None)
    a = _ended(100, 110, 250, "a")  # a ended, then an unknown thread took its tid
    _owners(monkeypatch, 7, a, now=now)
    assert threads.owner(7, 200, 240) == (hash("a"), "a")
    # Past a's seen end: nobody (/proc is read only for an id no thread known had: each read
    # lets the GIL go at a span's end).
    assert threads.owner(7, 320, 400) == (None, None)
    assert threads.owner(7, 200, 400) == (None, None)


def test_memory_is_bounded(monkeypatch):
    monkeypatch.setattr(threads, "MEMORY", 8)
    threads.watch_starts()
    for i in range(100):
        _ran(f"t{i}")
    gc.collect()
    threads._memory.known(0)  # (settles those freed since the last start)
    assert sum(len(o) for o in threads._memory.owners.values()) <= 8 + len(threading.enumerate())


def test_threads_sharing_a_kernel_thread_leave_it_to_its_owner():
    """Under gevent a Thread is a greenlet on the starting thread's kernel thread (its native_id):
    not an owner of that tid; the kernel thread's own is named (real gevent, its own process)."""
    script = """if True:
        from gevent import monkey; monkey.patch_all()
        import json, threading, time
        from otel_gil import threads
        threads.watch_starts()
        before = time.monotonic_ns()
        green = threading.Thread(target=time.sleep, args=(0.01,), name="green")
        green.start()
        me = threading.current_thread()
        print(json.dumps([green.native_id == me.native_id, threads.owner(me.native_id, before, time.monotonic_ns()),
                          [me.ident, me.name]]))
        green.join()
    """
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    shared, named, me = json.loads(done.stdout)
    assert shared and named == me, (named, me)


class _Worker(threading.Thread):
    """A thread whose object holds its work (as a pool's worker holds its queue)."""

    def __init__(self, work: object) -> None:
        super().__init__(name="worker")
        self.work = work


class _Work:
    pass


def test_an_ended_threads_objects_are_freed():
    """What an ended Thread held (its work queue) is freed once the app lets it go: the memory
    keeps its id and name, not the Thread, and is settled without a sweep."""
    threads.watch_starts()
    work = _Work()
    freed = weakref.ref(work)
    thread = _Worker(work)
    thread.start()
    thread.join()
    tid, ident = thread.native_id, thread.ident
    del thread, work
    gc.collect()
    assert freed() is None
    (known,) = threads._memory.known(tid)
    assert known.ref is None and known.ended_ns is not None and (known.ident, known.name) == (ident, "worker")


def test_a_start_costs_the_same_however_many_threads_are_known(monkeypatch):
    """Thread.start looks at its id's last owner only: none of the 5,000 others known."""
    threads.watch_starts()
    memory = threads._memory
    others = range(10**7, 10**7 + 5000)  # ids no thread here has
    for tid in others:
        memory.add(threads._Owner(tid, 0, 0, tid, f"t{tid}", ref=weakref.ref(threading.main_thread())))
    looked = []
    who = threads._Owner.who
    monkeypatch.setattr(threads._Owner, "who", lambda self: looked.append(self.tid) or who(self))
    _ran("one more")
    assert not set(looked) & set(others)


def test_concurrent_starts_are_all_known():
    """Threads started from 8 threads at once: each one's owner is kept (adds take the lock)."""
    threads.watch_starts()
    started: list = []

    def starter() -> None:
        for _ in range(50):
            t = threading.Thread(target=time.sleep, args=(0.001,))
            t.start()
            started.append((t.native_id, t.ident))

    starters = [threading.Thread(target=starter) for _ in range(8)]
    for t in starters:
        t.start()
    for t in starters:
        t.join()
    gc.collect()
    for tid, ident in started:
        assert ident in [o.ident for o in threads._memory.known(tid)], tid


def test_a_thread_whose_start_was_not_seen_is_named_only_since_its_task_began(monkeypatch):
    """A Thread started past our wrapper, and one started from C (a dummy, once it asks for
    current_thread()): named for a stretch only if /proc says its task had begun; the first
    read once (/proc each read lets the GIL go), a dummy before 3.13 by its kernel name (its
    Thread may be an ended thread's)."""
    threads.watch_starts()
    before = time.monotonic_ns() - 10**9
    time.sleep(2 / os.sysconf("SC_CLK_TCK"))  # (/proc's start time is to a tick)
    stop = threading.Event()
    unseen = threading.Thread(target=stop.wait, name="unseen")
    ORIGINAL(unseen)  # as a library that saved Thread.start before instrument() would
    ready, dummies = threading.Event(), []

    def from_c() -> None:
        dummies.append(threading.current_thread())
        ready.set()
        stop.wait()

    _thread.start_new_thread(from_c, ())
    try:
        assert ready.wait(5)
        time.sleep(2 / os.sysconf("SC_CLK_TCK"))
        now = time.monotonic_ns()
        reads = []
        task_owner = threads._task_owner
        monkeypatch.setattr(threads, "_task_owner", lambda tid: reads.append(tid) or task_owner(tid))
        for thread, name in ((unseen, "unseen"), (dummies[0], dummies[0].name if threads._DUMMIES_END else None)):
            tid = thread.native_id
            assert threads.owner(tid, before, before + 1000) == (None, None), "named before it began"
            named = threads.owner(tid, now - 1000, now)
            assert named[1] == (name or task_owner(tid).name), named
            assert threads.owner(tid, now - 1000, now) == named
        assert reads.count(unseen.native_id) == 1  # remembered
    finally:
        stop.set()
        unseen.join()

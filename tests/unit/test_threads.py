"""otel_gil.threads: its wrapper of Thread.start beside the threading instrumentation's (the
real one, wrapt), in either order and every undo order; and who a kernel tid was over a
stretch of time: real threads that ended, and synthetic successions of owners (tid reuse)."""

import json
import os
import subprocess
import sys
import threading
import time

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
    threads._memory.sweep()  # settled: its name kept without the thread
    assert threads.owner(thread.native_id, before, after) == (thread.ident, "short-lived")
    assert threads.owner(thread.native_id, before - 10**9, before - 1) == (None, None)  # before it, unknown


def _owners(monkeypatch, tid: int, *owners: threads._Owner, horizon: int = 0, now=None) -> None:
    memory = threads._Memory(0)
    memory.owners[tid], memory.horizon_ns = list(owners), horizon
    monkeypatch.setattr(threads, "_memory", memory)
    monkeypatch.setattr(threads, "_task_owner", lambda t: now)


def _ended(since: int, running: int, ended: int, name: str) -> threads._Owner:
    return threads._Owner(since, running, None, ident=hash(name), name=name, ended_ns=ended)


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
    now = threads._Owner(300, 310, None, ident=None, name="c-thread")
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
    threads._memory.sweep()
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

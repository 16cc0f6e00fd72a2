"""Probe plans made off the server's thread: worker processes, each with a time limit.

Making a plan reads files the registering process chose (its interpreter, its
libc, through ``/proc/<pid>/root``): a crafted ELF can be slow to parse and a
file on a FUSE mount may never answer a read. So :func:`probes.plan` runs in a
small pool of worker processes; the server hands a request to an idle worker
and keeps serving, collects the answer when the worker's pipe is readable, and
a worker still busy after ``timeout_s`` is killed (SIGKILL also ends a read
blocked in FUSE) and replaced. One uid has at most ``per_uid`` workers at a
time, so one user's files cannot occupy every worker.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import logging
import multiprocessing
import selectors
import signal
import time
from collections import deque
from typing import Callable, Hashable, Optional, Union

from otel_gil_collector import probes
from otel_gil import protocol

log = logging.getLogger("otel_gil.collector")

_PR_SET_PDEATHSIG = 1
Outcome = Union[probes.ProbePlan, probes.UnsupportedProcess]


def encode_plan(plan: probes.ProbePlan) -> dict:
    return dataclasses.asdict(plan)


def decode_plan(data: dict) -> probes.ProbePlan:
    return probes.ProbePlan(**{**data, "probes": tuple(probes.Probe(**p) for p in data["probes"])})


def _work(conn) -> None:
    """A worker's loop: one request (pid, gil_enabled) in, one outcome out, until EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the collector decides when workers end
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # and they end with it
    while True:
        try:
            pid, gil_enabled = json.loads(conn.recv_bytes())
        except (EOFError, OSError):
            return
        try:
            answer = {"plan": encode_plan(probes.plan(pid, gil_enabled=gil_enabled))}
        except probes.UnsupportedProcess as exc:
            answer = {"code": exc.code, "message": str(exc)}
        except Exception as exc:  # a reader bug is that registration's error, not the worker's end
            answer = {"code": protocol.INTERNAL, "message": f"locating probes failed: {exc!r}"[:512]}
        conn.send_bytes(json.dumps(answer).encode())


@dataclasses.dataclass
class _Job:
    key: Hashable
    uid: int
    pid: int
    gil_enabled: bool
    deadline: float = 0.0


class _Worker:
    def __init__(self, context) -> None:
        self.conn, theirs = context.Pipe()
        try:
            self.proc = context.Process(target=_work, args=(theirs,), name="otel-gil-planner", daemon=True)
            self.proc.start()
        except BaseException:
            self.conn.close()
            raise
        finally:
            theirs.close()
        self.job: Optional[_Job] = None


class Planner:
    """Runs :func:`probes.plan` for the server in ``workers`` processes; ``done(key, outcome)``
    is called on the server's thread with a ProbePlan or an UnsupportedProcess."""

    def __init__(
        self,
        sel: selectors.BaseSelector,
        done: Callable[[Hashable, Outcome], None],
        workers: int = 4,
        timeout_s: float = 10.0,
        per_uid: int = 2,
    ) -> None:
        self._sel = sel
        self._done = done
        self._timeout_s = timeout_s
        self._per_uid = per_uid
        self._context = multiprocessing.get_context("spawn")  # a fresh interpreter: no bcc, no threads
        self._queue: deque[_Job] = deque()
        self._size = workers
        self._workers: list[_Worker] = []
        self._dying: list[multiprocessing.Process] = []
        self._top_up()

    def _top_up(self) -> None:
        """Start workers until there are ``workers`` (a failure, e.g. out of fds, is retried next tick)."""
        while len(self._workers) < self._size:
            try:
                worker = _Worker(self._context)
            except OSError as exc:
                log.warning("cannot start a worker to locate probes (%s); retrying", exc)
                return
            self._sel.register(worker.conn, selectors.EVENT_READ, lambda _, w=worker: self._answered(w))
            self._workers.append(worker)

    def submit(self, key: Hashable, uid: int, pid: int, gil_enabled: bool) -> None:
        self._queue.append(_Job(key, uid, pid, gil_enabled))
        self._dispatch()

    def _dispatch(self) -> None:
        for worker in list(self._workers):
            if worker.job is not None:
                continue
            busy = {}
            for w in self._workers:
                if w.job is not None:
                    busy[w.job.uid] = busy.get(w.job.uid, 0) + 1
            job = next((j for j in self._queue if busy.get(j.uid, 0) < self._per_uid), None)
            if job is None:
                return
            self._queue.remove(job)
            try:
                worker.conn.send_bytes(json.dumps([job.pid, job.gil_enabled]).encode())
            except OSError:  # the worker died: a new one takes the request
                self._queue.appendleft(job)
                self._replace(worker)
                return
            job.deadline = time.monotonic() + self._timeout_s
            worker.job = job

    def _answered(self, worker: _Worker) -> None:
        job, worker.job = worker.job, None
        try:
            answer = json.loads(worker.conn.recv_bytes())
        except (EOFError, OSError, ValueError):
            self._replace(worker)
            answer = {"code": protocol.INTERNAL, "message": "the worker locating probes died"}
        if job is not None:
            if "plan" in answer:
                outcome: Outcome = decode_plan(answer["plan"])
            else:
                outcome = probes.UnsupportedProcess(str(answer["code"]), str(answer["message"]))
            self._done(job.key, outcome)
        self._dispatch()

    def _replace(self, worker: _Worker) -> None:
        self._sel.unregister(worker.conn)
        worker.conn.close()
        worker.proc.kill()
        self._dying.append(worker.proc)
        self._workers.remove(worker)
        self._top_up()

    def tick(self) -> None:
        """Kill workers past their request's deadline (that request gets a timeout), reap the dead."""
        now = time.monotonic()
        for worker in list(self._workers):
            job = worker.job
            if job is not None and now > job.deadline:
                log.warning("pid %d (uid %d): examining its files took over %.0f s; worker killed",
                            job.pid, job.uid, self._timeout_s)
                worker.job = None
                self._replace(worker)
                self._done(job.key, probes.UnsupportedProcess(
                    protocol.UNSUPPORTED_INTERPRETER,
                    f"examining the interpreter's files took over {self._timeout_s:.0f} s "
                    "(a file that does not answer, e.g. on a stalled FUSE mount?)",
                ))
        self._dying = [p for p in self._dying if p.is_alive()]  # is_alive() reaps without blocking
        self._top_up()
        self._dispatch()

    def close(self) -> None:
        for worker in self._workers:
            self._sel.unregister(worker.conn)
            worker.conn.close()
            worker.proc.kill()
        for proc in self._dying + [w.proc for w in self._workers]:
            proc.join(1)
        self._workers.clear()

"""Where a free-threaded build's threads park, and whether a park says why (README, "Free-threaded
builds", "Parked time"). Root: bcc.

A child process on ``--python`` (a free-threaded build, its GIL off) waits four times for a thread
that keeps something for ``--hold-ms`` (a ``ctypes.PyDLL`` usleep: the holder stays attached):
a ``threading.Lock``, a list's critical section (``list.sort`` calling a key function), a
stop-the-world (``gc.collect()``) and a ``Thread.join``. Every ``sem_wait``/``sem_clockwait``/
``sem_timedwait`` call of the child, the calls CPython parks a thread with on glibc, is timed
(a uprobe and a uretprobe: a study, not the collector's way) with the function that made it, and
every ``_PyParkingLot_Park`` call (libpython's, exported) gives the address parked on: the lock
object's ``PyMutex`` (32 bytes into it on a free-threaded build), the list's ``ob_mutex`` (10
bytes in), or another.

    sudo .venv/bin/python bench/parks.py --python .venv-matrix/3.13t/bin/python
"""

from __future__ import annotations

import argparse
import atexit
import collections
import json
import subprocess
import sys
import textwrap

sys.path.insert(0, "/usr/lib/python3/dist-packages")  # bcc, from a virtualenv too
from bcc import BPF  # noqa: E402

_BPF = r"""
#include <uapi/linux/ptrace.h>
struct start { u64 ns; u64 caller; };
struct park { u32 tid; u64 caller; u64 start_ns; u64 ns; };
struct address { u32 tid; u64 address; u64 ns; };
BPF_HASH(starts, u32, struct start);  /* tid -> its sem_* call in progress */
BPF_PERF_OUTPUT(parks);               /* each call, timed */
BPF_PERF_OUTPUT(addresses);           /* each _PyParkingLot_Park: what it parks on */

int park(struct pt_regs *ctx)
{
    if (bpf_get_current_pid_tgid() >> 32 != PID)
        return 0;
    struct address a = {(u32)bpf_get_current_pid_tgid(), PT_REGS_PARM1(ctx), bpf_ktime_get_ns()};
    addresses.perf_submit(ctx, &a, sizeof(a));
    return 0;
}

int enter(struct pt_regs *ctx)
{
    if (bpf_get_current_pid_tgid() >> 32 != PID)
        return 0;
    struct start s = {bpf_ktime_get_ns(), 0};
    bpf_probe_read_user(&s.caller, 8, (void *)PT_REGS_SP(ctx)); /* the return address */
    u32 tid = bpf_get_current_pid_tgid();
    starts.update(&tid, &s);
    return 0;
}

int leave(struct pt_regs *ctx)
{
    u32 tid = bpf_get_current_pid_tgid();
    struct start *s = starts.lookup(&tid);
    if (!s)
        return 0;
    struct park p = {tid, s->caller, s->ns, bpf_ktime_get_ns() - s->ns};
    starts.delete(&tid);
    parks.perf_submit(ctx, &p, sizeof(p));
    return 0;
}
"""

_WORKLOAD = textwrap.dedent("""
    import ctypes, gc, json, sys, threading, time
    libc, hold_us = ctypes.PyDLL(None), int(sys.argv[1])
    print(flush=True)
    sys.stdin.readline()  # traced from here
    lock, shared, waits = threading.Lock(), list(range(10)), []

    def waited(kind, holder, wait):
        started = threading.Event()
        t = threading.Thread(target=holder, args=(started,))
        t.start()
        started.wait()
        t0 = time.monotonic_ns()
        wait()
        waits.append([kind, t0, time.monotonic_ns()])
        t.join()

    def hold_lock(started):
        with lock:
            started.set()
            libc.usleep(hold_us)

    def sort_slowly(started):
        def key(x):
            if x == 0:
                started.set()
                libc.usleep(hold_us)
            return x
        shared.sort(key=key)  # the list's critical section, held while attached

    def stay_attached(started):
        started.set()
        libc.usleep(hold_us)  # no safe point: a stop-the-world waits for it

    waited("threading.Lock", hold_lock, lambda: (lock.acquire(), lock.release()))
    waited("critical section", sort_slowly, lambda: shared.append(1))
    waited("stop-the-world", stay_attached, gc.collect)
    t = threading.Thread(target=libc.usleep, args=(hold_us,))
    t.start()
    t0 = time.monotonic_ns()
    t.join()
    waits.append(["Thread.join", t0, time.monotonic_ns()])
    print(json.dumps({"gil": sys._is_gil_enabled(), "waits": waits, "lock": id(lock), "list": id(shared)}), flush=True)
""")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", required=True, help="a free-threaded build's interpreter")
    parser.add_argument("--hold-ms", type=int, default=200)
    parser.add_argument("--libc", default="/lib/x86_64-linux-gnu/libc.so.6")
    args = parser.parse_args()
    child = subprocess.Popen([args.python, "-c", _WORKLOAD, str(args.hold_ms * 1000)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    child.stdout.readline()
    bpf = BPF(text=_BPF.replace("PID", str(child.pid)))
    for name in ("sem_wait", "sem_clockwait", "sem_timedwait"):
        bpf.attach_uprobe(name=args.libc, sym=name, fn_name="enter", pid=child.pid)
        bpf.attach_uretprobe(name=args.libc, sym=name, fn_name="leave", pid=child.pid)
    bpf.attach_uprobe(name=_libpython(child.pid), sym="_PyParkingLot_Park", fn_name="park", pid=child.pid)
    parks, addresses = [], []
    bpf["parks"].open_perf_buffer(lambda cpu, data, size: parks.append(bpf["parks"].event(data)))
    bpf["addresses"].open_perf_buffer(lambda cpu, data, size: addresses.append(bpf["addresses"].event(data)))
    child.stdin.write("go\n")
    child.stdin.flush()
    report = json.loads(child.stdout.readline())
    bpf.perf_buffer_poll(timeout=500)
    callers = {p.caller: bpf.sym(p.caller, child.pid, show_offset=False).decode() for p in parks}
    child.wait()
    atexit.unregister(bpf.cleanup)
    try:
        bpf.cleanup()
    except Exception:  # bcc also looks for tracefs, absent here; the perf uprobes went with their fds
        pass
    print(f"GIL on: {report['gil']}; hold {args.hold_ms} ms each")
    known = {report["lock"] + 32: "the lock's PyMutex", report["list"] + 10: "the list's ob_mutex"}
    print("| wait (its truth) | waited, ms | parks | parked, ms | called from | parked on |")
    print("|---|---|---|---|---|---|")
    for kind, t0, t1 in report["waits"]:  # CLOCK_MONOTONIC, as bpf_ktime_get_ns
        inside = [p for p in parks if t0 <= p.start_ns and p.start_ns + p.ns <= t1]
        by = collections.Counter(callers[p.caller] for p in inside)
        on = collections.Counter(known.get(a.address, "another address") for a in addresses if t0 <= a.ns <= t1)
        print(f"| {kind} | {(t1 - t0) / 1e6:.1f} | {len(inside)} | {sum(p.ns for p in inside) / 1e6:.1f} | "
              f"{', '.join(f'{name} ({n})' for name, n in by.items())} | "
              f"{', '.join(f'{name} ({n})' for name, n in on.items())} |")


def _libpython(pid: int) -> str:
    """The libpython ``pid`` mapped (where ``_PyParkingLot_Park`` is)."""
    with open(f"/proc/{pid}/maps") as maps:
        return next(line.split()[-1] for line in maps if "/libpython3" in line)


if __name__ == "__main__":
    main()

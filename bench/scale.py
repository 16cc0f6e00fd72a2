"""Scale: 1,000 threads in one registered process, 100 registered processes at once.

    sudo .venv/bin/python bench/scale.py [--threads 1000] [--processes 100]

threads    one process registers, starts the threads; each makes 20 os.write +
           os.read pairs (40 GIL acquisitions at least) and waits; while all live,
           the process reads every thread's slot: correct = a slot found with >= 40.
processes  that many processes register at once, make 200 pairs each, check their
           own slot the same way, and wait; then all exit together.
For each: the collector's CPU time (utime + stime; the BPF programs themselves
run in the traced threads, not here) and RSS, and the memory of its BPF maps
(memlock), and for the processes the time until the collector holds no more of
their uprobes and arrays after they exit. Writes the section "scale" of
bench/RESULTS.md and raw figures to bench/out/scale.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
import results  # noqa: E402
import stack  # noqa: E402

THREADS = r"""
import json, os, sys, threading, time
from otel_gil.client import Registration
from otel_gil import ring as ringlib
reg = Registration(sys.argv[1]); reg.start(); reg.wait(30)
assert reg.state.status == "ok", reg.state.detail
n, pairs = int(sys.argv[2]), 20
done, release, tids = threading.Barrier(n + 1), threading.Event(), [0] * n
def work(i):
    tids[i] = threading.get_native_id()
    r, w = os.pipe()
    for _ in range(pairs):
        os.write(w, b"x"); os.read(r, 1)
    os.close(r); os.close(w)
    done.wait(); release.wait()
threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
t0 = time.monotonic()
for t in threads: t.start()
done.wait()
now = time.monotonic_ns()
correct = sum(1 for tid in tids if (i := reg.state.ring.find(tid)) >= 0 and ringlib.counters(reg.state.ring.slot(i), now).acquisitions >= 2 * pairs)
print(json.dumps({"correct": correct, "seconds": time.monotonic() - t0, "overflows": reg.state.ring.header.slot_overflows}), flush=True)
release.set()
for t in threads: t.join()
"""

PROCESS = r"""
import json, os, sys, threading, time
from otel_gil.client import Registration
from otel_gil import ring as ringlib
t0 = time.monotonic()
reg = Registration(sys.argv[1]); reg.start(); reg.wait(120)
registered = time.monotonic() - t0
ok = reg.state.status == "ok"
if ok:
    r, w = os.pipe()
    for _ in range(200):
        os.write(w, b"x"); os.read(r, 1)
    i = reg.state.ring.find(threading.get_native_id())
    ok = i >= 0 and ringlib.counters(reg.state.ring.slot(i), time.monotonic_ns()).acquisitions >= 400
print(json.dumps({"ok": ok, "register_s": registered, "status": reg.state.status}), flush=True)
sys.stdin.readline()
"""


def usage(pid: int) -> dict:
    """CPU seconds so far, RSS and BPF map memory of process ``pid``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    rss = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    memlock = maps = perf = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            info = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if "map_type:" in info:
            maps += 1
            memlock += int(info.split("memlock:")[1].split()[0])
        perf += target == "anon_inode:[perf_event]"
    return {"cpu_s": cpu, "rss_mb": rss / 2**20, "bpf_map_mb": memlock / 2**20, "maps": maps, "perf_events": perf}


def threads_case(sock: str, collector: stack.Service, n: int) -> dict:
    before = usage(collector.proc.pid)
    out = subprocess.run([sys.executable, "-c", THREADS, sock, str(n)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    if out.returncode:
        raise RuntimeError(out.stderr)
    during = usage(collector.proc.pid)
    return {**json.loads(out.stdout), "threads": n, "collector_cpu_s": during["cpu_s"] - before["cpu_s"], **during}


def processes_case(sock: str, collector: stack.Service, n: int) -> dict:
    base = usage(collector.proc.pid)
    t0 = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-c", PROCESS, sock], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}) for _ in range(n)]
    reports = [json.loads(p.stdout.readline()) for p in procs]
    all_up = time.monotonic() - t0
    during = usage(collector.proc.pid)
    t1 = time.monotonic()
    for p in procs:
        p.stdin.close()
    for p in procs:
        p.wait()
    while time.monotonic() - t1 < 600:  # every uprobe closed and every array freed, as before the processes came
        now = usage(collector.proc.pid)
        if now["perf_events"] <= base["perf_events"] and now["maps"] <= base["maps"]:
            break
        time.sleep(0.2)
    released = time.monotonic() - t1
    after = usage(collector.proc.pid)
    waits = sorted(r["register_s"] for r in reports)
    return {
        "processes": n, "correct": sum(r["ok"] for r in reports), "all_registered_s": all_up,
        "register_p50_s": statistics.median(waits), "register_max_s": waits[-1],
        "collector_cpu_s": during["cpu_s"] - base["cpu_s"], **during,
        "teardown_s": released, "teardown_cpu_s": after["cpu_s"] - during["cpu_s"],
        "perf_events_after": after["perf_events"], "perf_events_before": base["perf_events"],
        "statuses": sorted({r["status"] for r in reports}),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1000)
    parser.add_argument("--processes", type=int, default=100)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="otel-gil-bench-"))
    sock = str(work / "gil.sock")
    collector = stack.start_collector(sock, work / "collector.log")
    try:
        idle = usage(collector.proc.pid)
        t = threads_case(sock, collector, args.threads)
        print("threads:", t, flush=True)
        p = processes_case(sock, collector, args.processes)
        print("processes:", p, flush=True)
    finally:
        collector.stop()
    results.OUT.mkdir(exist_ok=True)
    (results.OUT / "scale.json").write_text(json.dumps({"idle": idle, "threads": t, "processes": p}, indent=1))
    body = "\n".join([
        f"`sudo .venv/bin/python bench/scale.py --threads {args.threads} --processes {args.processes}` on "
        f"{results.machine()}. One collector (default --max-threads 2048 slots per process).",
        "",
        "| case | correct | collector CPU | collector RSS | BPF maps | other |",
        "|---|---|---|---|---|---|",
        f"| idle collector | - | - | {idle['rss_mb']:.0f} MB | {idle['bpf_map_mb']:.1f} MB ({idle['maps']} maps) | - |",
        f"| {t['threads']} threads, 1 process | {t['correct']}/{t['threads']} threads with a slot and >= 40 "
        f"acquisitions | {t['collector_cpu_s']:.2f} s | {t['rss_mb']:.0f} MB | {t['bpf_map_mb']:.1f} MB | "
        f"{t['seconds']:.1f} s to start all, {t['overflows']} slot overflows |",
        f"| {p['processes']} processes at once | {p['correct']}/{p['processes']} saw their own figures | "
        f"{p['collector_cpu_s']:.2f} s to register all | {p['rss_mb']:.0f} MB | {p['bpf_map_mb']:.1f} MB "
        f"({p['maps']} maps) | registration p50 {p['register_p50_s']:.2f} s, max {p['register_max_s']:.2f} s; "
        f"{p['perf_events']} uprobes |",
        f"| ... and all exit | - | {p['teardown_cpu_s']:.2f} s | - | - | every uprobe and array released after "
        f"{p['teardown_s']:.1f} s; perf events {p['perf_events_before']} before, {p['perf_events_after']} after |",
        "",
        "Each registered process costs one BPF array of (slots + 1) x the slot size, and 3 uprobes (2 once its "
        "GIL is located). Detaching a uprobe waits for the kernel (about 85 ms each, serialised), which is what "
        "the teardown time measures; the collector does it off its serving thread.",
    ])
    results.write_section("scale", body)
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Drive an example service with bounded load (loopback by default), print latencies.

    python examples/load.py --url http://127.0.0.1:8000 --routes /io,/cpu --requests 200 --concurrency 4
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import urllib.request
from collections import defaultdict


def drive(url: str, routes: list[str], requests: int, concurrency: int, deadline_s: float) -> dict:
    latencies: dict[str, list[float]] = defaultdict(list)
    errors: dict[str, int] = defaultdict(int)
    counter = iter(range(requests))
    lock = threading.Lock()
    stop_at = time.monotonic() + deadline_s

    def worker() -> None:
        while time.monotonic() < stop_at:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            route = routes[i % len(routes)]
            t0 = time.perf_counter()
            try:
                with urllib.request.urlopen(url + route, timeout=30) as resp:
                    resp.read()
                latencies[route].append(time.perf_counter() - t0)
            except OSError:
                errors[route] += 1

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"latencies": dict(latencies), "errors": dict(errors)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--routes", default="/io,/cpu,/slow_c")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-seconds", type=float, default=120, help="stop early after this long")
    args = parser.parse_args()
    result = drive(args.url, args.routes.split(","), args.requests, args.concurrency, args.max_seconds)
    print(f"{'route':<10} {'count':>6} {'median ms':>10} {'p99 ms':>8} {'errors':>7}")
    for route in args.routes.split(","):
        lat = sorted(result["latencies"].get(route, []))
        p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1e3 if lat else float("nan")
        med = statistics.median(lat) * 1e3 if lat else float("nan")
        print(f"{route:<10} {len(lat):>6} {med:>10.1f} {p99:>8.1f} {result['errors'].get(route, 0):>7}")
    return 1 if sum(result["errors"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())

"""Drive an example service with bounded load and print each route's latencies (stdlib only).

    python examples/load.py --url http://127.0.0.1:8000 --routes /io,/cpu --requests 200 --concurrency 4

Requests go round-robin over the routes: at most --requests of them, none started after
--max-seconds, each given up after --timeout. Only loopback addresses are allowed unless
--allow-remote is given.
Exits 1 if any request failed (connection error, timeout or HTTP status >= 400).
"""

from __future__ import annotations

import argparse
import http.client
import ipaddress
import math
import socket
import statistics
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field


@dataclass
class Results:
    """Per route: latencies (seconds) of the answered requests, and the number of failures."""

    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    sent: int = 0


def is_loopback(url: str) -> bool:
    """Whether every address the URL's host resolves to is a loopback address."""
    parts = urllib.parse.urlsplit(url)
    try:
        infos = socket.getaddrinfo(parts.hostname, parts.port or 80, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError):
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


def drive(url: str, routes: list[str], requests: int, concurrency: int, max_seconds: float, timeout: float) -> Results:
    """Send up to ``requests`` GETs from ``concurrency`` threads, starting none after ``max_seconds``."""
    results = Results()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via an http_proxy
    lock = threading.Lock()
    stop_at = time.monotonic() + max_seconds

    def worker() -> None:
        while True:
            with lock:
                if results.sent >= requests or time.monotonic() >= stop_at:
                    return
                route = routes[results.sent % len(routes)]
                results.sent += 1
            start = time.perf_counter()
            try:
                with opener.open(url + route, timeout=timeout) as resp:
                    resp.read()
            except (OSError, http.client.HTTPException):  # URLError, HTTPError, timeouts, resets
                with lock:
                    results.errors[route] += 1
                continue
            elapsed = time.perf_counter() - start
            with lock:
                results.latencies[route].append(elapsed)

    threads = [threading.Thread(target=worker, name=f"load-{i}") for i in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def report(results: Results, routes: list[str]) -> str:
    """A table: per route, answered count, median and p99 (nearest rank) latency in ms, errors."""
    lines = [f"{'route':<12} {'count':>6} {'median ms':>10} {'p99 ms':>8} {'errors':>7}"]
    for route in routes:
        lat = sorted(results.latencies.get(route, []))
        median = statistics.median(lat) * 1e3 if lat else math.nan
        p99 = lat[math.ceil(0.99 * len(lat)) - 1] * 1e3 if lat else math.nan
        lines.append(f"{route:<12} {len(lat):>6} {median:>10.1f} {p99:>8.1f} {results.errors.get(route, 0):>7}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="base URL (default %(default)s)")
    parser.add_argument("--routes", default="/io,/cpu,/slow_c", help="comma-separated paths (default %(default)s)")
    parser.add_argument("--requests", type=int, default=200, help="requests in all (default %(default)s)")
    parser.add_argument("--concurrency", type=int, default=4, help="client threads (default %(default)s)")
    parser.add_argument("--max-seconds", type=float, default=120, help="seconds to send for (default %(default)s)")
    parser.add_argument("--timeout", type=float, default=30, help="per-request timeout, s (default %(default)s)")
    parser.add_argument("--allow-remote", action="store_true", help="allow a URL that is not loopback")
    args = parser.parse_args()
    url = args.url.rstrip("/")
    routes = [r if r.startswith("/") else "/" + r for r in args.routes.split(",") if r]
    if not routes or args.requests < 1 or args.concurrency < 1 or args.max_seconds <= 0 or args.timeout <= 0:
        parser.error("need at least one route, and positive --requests, --concurrency, --max-seconds and --timeout")
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        parser.error(f"--url must be http:// or https://, not {args.url!r}")
    if not args.allow_remote and not is_loopback(url):
        parser.error(f"{args.url} is not a loopback address (pass --allow-remote to load it anyway)")
    results = drive(url, routes, args.requests, args.concurrency, args.max_seconds, args.timeout)
    print(report(results, routes))
    if results.sent < args.requests:
        print(f"stopped after {args.max_seconds:g} s: {results.sent} of {args.requests} requests sent", file=sys.stderr)
    return 1 if sum(results.errors.values()) else 0


if __name__ == "__main__":
    sys.exit(main())

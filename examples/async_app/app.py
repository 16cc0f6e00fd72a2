"""The async example: FastAPI on uvicorn's event loop, no otel-gil code here either
(``opentelemetry-instrument`` adds it). Every request in flight shares the loop's one
thread, so a request's spans carry its own code's GIL time (``gil.hold_ms``), the loop's
time on the other requests meanwhile (``gil.others_hold_ms``) and what held it up
(``gil.wait_ms``: the loop's waits while it was in flight, behind the ``metrics-collector``
thread of examples/workload.py).

From the repository root (see examples/README.md):

    opentelemetry-instrument uvicorn --app-dir examples/async_app --port 8000 app:app
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
import sys
import urllib.parse
import urllib.request

from fastapi import FastAPI, HTTPException
from opentelemetry import trace
from starlette.responses import PlainTextResponse

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # for examples/workload.py
import workload  # noqa: E402

app = FastAPI()
tracer = trace.get_tracer(__name__)
# The services /chain/NAME calls, as EXAMPLE_BACKENDS names them: "NAME=URL,NAME=URL".
BACKENDS = dict(pair.split("=", 1) for pair in os.environ.get("EXAMPLE_BACKENDS", "").split(",") if "=" in pair)


@app.middleware("http")
async def start_the_hog(request, call_next):
    """This process's metrics-collector thread, started on its first request."""
    workload.ensure_hog()
    return await call_next(request)


@app.get("/io", response_class=PlainTextResponse)
async def io() -> str:
    """Ten 2 ms waits on the loop, like small queries: slow only when someone keeps the GIL."""
    for _ in range(10):
        await asyncio.sleep(0.002)
    return "io done\n"


@app.get("/cpu", response_class=PlainTextResponse)
async def cpu() -> str:
    """20 ms of pure Python on the loop: no other request runs meanwhile."""
    return workload.cpu_bound()


@app.get("/cpu_def", response_class=PlainTextResponse)
def cpu_def() -> str:
    """The same in a worker thread (FastAPI runs ``def`` routes there): its time is still this request's."""
    return workload.cpu_bound()


async def _part(n: int) -> int:
    with tracer.start_as_current_span(f"part {n}"):
        await asyncio.sleep(0.002)
        return workload.compute_stats(2000)


@app.get("/fanout", response_class=PlainTextResponse)
async def fanout() -> str:
    """Three parts at once (asyncio.gather), each in a span of its own."""
    parts = await asyncio.gather(*(_part(n) for n in range(3)))
    return f"fanout done ({len(parts)} parts)\n"


@app.get("/slow_c", response_class=PlainTextResponse)
async def slow_c() -> str:
    """A 20 ms C call that keeps the GIL, on the loop: everyone waits."""
    return workload.slow_c()


@app.get("/blocked", response_class=PlainTextResponse)
async def blocked() -> str:
    """Another thread's known hold of the GIL, waited out on the loop (a ground truth)."""
    return workload.blocked()


@app.get("/chain/{backend}", response_class=PlainTextResponse)
def chain(backend: str) -> str:
    """The backend's /io, over HTTP from a worker thread: urllib's instrumentation sends the
    trace context along, so one trace holds both services' server spans."""
    if backend not in BACKENDS:
        raise HTTPException(404, f"no backend {backend!r} in EXAMPLE_BACKENDS")
    with urllib.request.urlopen(f"{replica(BACKENDS[backend])}/io", timeout=30) as resp:
        return f"{backend}: {resp.read().decode()}"


def replica(url: str) -> str:
    """The URL with its host name replaced by one of its addresses at random: requests spread over
    a compose service's replicas (whose DNS answer comes in one order), as over a Service's pods."""
    parts = urllib.parse.urlsplit(url)
    address = random.choice(socket.getaddrinfo(parts.hostname, parts.port, socket.AF_INET, socket.SOCK_STREAM))[4][0]
    return parts._replace(netloc=f"{address}:{parts.port}").geturl()


@app.get("/health", response_class=PlainTextResponse)
async def health() -> str:
    return workload.health()

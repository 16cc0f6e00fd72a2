"""The app of bench/asyncload.py: FastAPI, no otel-gil code (`opentelemetry-instrument` adds it, or not)."""

import asyncio
import time

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from opentelemetry import trace

app = FastAPI()
tracer = trace.get_tracer(__name__)


@app.get("/hello", response_class=PlainTextResponse)
async def hello() -> str:
    return "hello"


@app.get("/work", response_class=PlainTextResponse)
async def work() -> str:
    """About 1 ms of pure-Python work between two awaits (the loop runs others meanwhile)."""
    n = 0
    for _ in range(2):
        until = time.perf_counter() + 0.0005
        while time.perf_counter() < until:
            n += sum(i * i for i in range(50))
        await asyncio.sleep(0)
    return str(n)


async def _part() -> None:
    with tracer.start_as_current_span("part"):
        await asyncio.sleep(0)


@app.get("/fanout", response_class=PlainTextResponse)
async def fanout() -> str:
    """Three parts at once, each in a span of its own."""
    await asyncio.gather(_part(), _part(), _part())
    return "fanout"

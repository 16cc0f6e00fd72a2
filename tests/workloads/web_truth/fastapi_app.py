"""FastAPI on uvicorn: ``async def`` routes on the loop, a ``def`` route in anyio's worker
threads, ``gather`` children with spans of their own, and a busy route for the loop's waits."""

from __future__ import annotations

import asyncio
import time

from fastapi import FastAPI
from opentelemetry import trace

from truth import PIECE_MS, hog, pydll_hold, spin

app = FastAPI()
tracer = trace.get_tracer(__name__)


@app.get("/own")
async def own() -> dict:
    """Three pieces between awaits, then a PyDLL hold."""
    ns = 0
    for _ in range(3):
        ns += spin(PIECE_MS)
        await asyncio.sleep(0.02)
    return {"own_ns": ns + pydll_hold(2)}


@app.get("/own_def")
def own_def() -> dict:
    """The same in a worker thread (FastAPI runs ``def`` routes there, in the request's context)."""
    ns = 0
    for _ in range(3):
        ns += spin(PIECE_MS)
        time.sleep(0.02)
    return {"own_ns": ns + pydll_hold(2)}


async def _child(n: int) -> tuple[str, int]:
    with tracer.start_as_current_span(f"child-{n}") as span:
        ns = spin(PIECE_MS / 2)
        await asyncio.sleep(0.01)
        ns += spin(PIECE_MS / 2)
    return f"{span.get_span_context().span_id:016x}", ns


@app.get("/gather")
async def gather() -> dict:
    """A piece of its own, then two children at once, each in its own span."""
    ns = spin(PIECE_MS)
    children = dict(await asyncio.gather(_child(0), _child(1)))
    return {"own_ns": ns + sum(children.values()), "children": children}


@app.get("/busy")
async def busy() -> dict:
    """Ten short pieces, yielding between them: the loop always has a task ready, so it waits
    out every hold of the hog while requests are in flight."""
    ns = 0
    for _ in range(10):
        ns += spin(2)
        await asyncio.sleep(0)
    return {"own_ns": ns}


@app.get("/hog")
def hog_switch(on: int) -> dict:
    """Start the hog (on=1), or stop it and answer its holds (on=0)."""
    if on:
        hog.start()
        return {}
    return {"holds": hog.stop()}


@app.get("/health")
async def health() -> dict:
    return {}

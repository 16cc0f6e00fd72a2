"""FastAPI on uvicorn: ``async def`` routes on the loop, a ``def`` route in anyio's worker
threads, ``gather`` children with spans of their own, and a busy route for the loop's waits."""

from __future__ import annotations

import asyncio
import time

from fastapi import FastAPI
from opentelemetry import trace

from truth import PIECE_MS, Held, answer, clock, hog, pydll_hold, since, spin, total

app = FastAPI()
tracer = trace.get_tracer(__name__)


@app.get("/own")
async def own() -> dict:
    """Three pieces between awaits, then a PyDLL hold."""
    pieces = []
    for _ in range(3):
        pieces.append(spin(PIECE_MS))
        await asyncio.sleep(0.02)
    return answer(total(*pieces, pydll_hold(2)))


@app.get("/own_def")
def own_def() -> dict:
    """In a worker thread (FastAPI runs ``def`` routes there, in the request's context): three
    PyDLL holds between sleeps (truth.THREADED says why not pure Python)."""
    pieces = []
    for _ in range(3):
        pieces.append(pydll_hold(PIECE_MS))
        time.sleep(0.02)
    return answer(total(*pieces))


async def _child(n: int) -> tuple[str, Held, Held]:
    """(span id, its own span's truth, the truth of all its code: its span's start and end run
    in the request's context too)."""
    whole = clock()
    with tracer.start_as_current_span(f"child-{n}") as span:
        own = spin(PIECE_MS / 2)
        ran = since(whole)
        await asyncio.sleep(0.01)
        whole = clock()
        own = total(own, spin(PIECE_MS / 2))
    return f"{span.get_span_context().span_id:016x}", own, total(ran, since(whole))


@app.get("/gather")
async def gather() -> dict:
    """A piece of its own, then two children at once, each in its own span."""
    start = clock()
    mine = spin(PIECE_MS)
    children = asyncio.gather(_child(0), _child(1))
    mine = since(start)
    done = await children
    return answer(total(mine, *(whole for _, _, whole in done)), children={i: own for i, own, _ in done})


@app.get("/busy")
async def busy() -> dict:
    """Ten short pieces, yielding between them: the loop always has a task ready, so it waits
    out every hold of the hog while requests are in flight."""
    pieces = []
    for _ in range(10):
        pieces.append(spin(2))
        await asyncio.sleep(0)
    return answer(total(*pieces))


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



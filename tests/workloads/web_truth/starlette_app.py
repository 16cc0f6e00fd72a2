"""Starlette on uvicorn (asyncio or uvloop): ``async`` routes on the loop."""

from __future__ import annotations

import asyncio

from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from truth import PIECE_MS, answer, pydll_hold, spin, total


async def own(request) -> JSONResponse:
    """Three pieces between awaits, then a PyDLL hold."""
    pieces = []
    for _ in range(3):
        pieces.append(spin(PIECE_MS))
        await asyncio.sleep(0.02)
    return JSONResponse(answer(total(*pieces, pydll_hold(2))))


async def health(request) -> JSONResponse:
    return JSONResponse({})


app = Starlette(routes=[Route("/own", own), Route("/health", health)])

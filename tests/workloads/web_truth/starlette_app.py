"""Starlette on uvicorn (asyncio or uvloop): ``async`` routes on the loop."""

from __future__ import annotations

import asyncio

from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from truth import PIECE_MS, pydll_hold, spin


async def own(request) -> JSONResponse:
    """Three pieces between awaits, then a PyDLL hold."""
    ns = 0
    for _ in range(3):
        ns += spin(PIECE_MS)
        await asyncio.sleep(0.02)
    return JSONResponse({"own_ns": ns + pydll_hold(2)})


async def health(request) -> JSONResponse:
    return JSONResponse({})


app = Starlette(routes=[Route("/own", own), Route("/health", health)])

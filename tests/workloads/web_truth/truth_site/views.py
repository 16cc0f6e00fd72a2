"""The ground-truth views (truth.py says what a request's truth is)."""

from __future__ import annotations

import asyncio
import time

from django.http import HttpRequest, JsonResponse

from truth import PIECE_MS, answer, pydll_hold, spin, total


async def own(request: HttpRequest) -> JsonResponse:
    """Three pieces between awaits, then a PyDLL hold."""
    pieces = []
    for _ in range(3):
        pieces.append(spin(PIECE_MS))
        await asyncio.sleep(0.02)
    return JsonResponse(answer(total(*pieces, pydll_hold(2))))


def own_sync(request: HttpRequest) -> JsonResponse:
    """Three PyDLL holds between sleeps: under ASGI Django runs it in a thread of its own per
    request (truth.THREADED says why not pure Python), on gevent workers in a greenlet."""
    pieces = []
    for _ in range(3):
        pieces.append(pydll_hold(PIECE_MS))
        time.sleep(0.02)
    return JsonResponse(answer(total(*pieces)))


def health(request: HttpRequest) -> JsonResponse:
    return JsonResponse({})


"""Flask on gunicorn's gevent workers: each request a greenlet, time.sleep a switch."""

from __future__ import annotations

import time

from flask import Flask

from truth import PIECE_MS, answer, pydll_hold, spin, total

app = Flask(__name__)


@app.get("/own")
def own() -> dict:
    """Three pieces between sleeps (gevent switches to other requests there), then a PyDLL hold."""
    pieces = []
    for _ in range(3):
        pieces.append(spin(PIECE_MS))
        time.sleep(0.02)
    return answer(total(*pieces, pydll_hold(2)))


@app.get("/health")
def health() -> dict:
    return {}

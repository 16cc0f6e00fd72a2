"""Flask on gunicorn's gevent workers: each request a greenlet, time.sleep a switch."""

from __future__ import annotations

import time

from flask import Flask

from truth import PIECE_MS, pydll_hold, spin

app = Flask(__name__)


@app.get("/own")
def own() -> dict:
    """Three pieces between sleeps (gevent switches to other requests there), then a PyDLL hold."""
    ns = 0
    for _ in range(3):
        ns += spin(PIECE_MS)
        time.sleep(0.02)
    return {"own_ns": ns + pydll_hold(2)}


@app.get("/health")
def health() -> dict:
    return {}

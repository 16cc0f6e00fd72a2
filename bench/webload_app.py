"""The app of bench/webload.py: no otel-gil code, `opentelemetry-instrument` adds it (or not)."""

import time

from flask import Flask

app = Flask(__name__)


@app.get("/hello")
def hello() -> str:
    return "hello"


@app.get("/work")
def work() -> str:
    """About 2 ms of pure-Python work (the GIL held throughout)."""
    until = time.perf_counter() + 0.002
    n = 0
    while time.perf_counter() < until:
        n += sum(i * i for i in range(50))
    return str(n)

"""The Flask example: no otel-gil code here, ``opentelemetry-instrument`` adds it.

From the repository root (see examples/README.md):

    opentelemetry-instrument flask --app examples/flask_app/app.py run --port 8000
    opentelemetry-instrument gunicorn --chdir examples/flask_app -b 127.0.0.1:8000 -w 2 app:app
"""

import os
import sys

from flask import Flask

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # for examples/workload.py
import workload  # noqa: E402

app = Flask(__name__)
app.before_request(workload.ensure_hog)  # each process (each gunicorn worker) starts its own hog


@app.get("/io")
def io() -> str:
    """Blocking waits: slow only when another thread keeps the GIL."""
    return workload.io_bound()


@app.get("/cpu")
def cpu() -> str:
    """Pure-Python work."""
    return workload.cpu_bound()


@app.get("/slow_c")
def slow_c() -> str:
    """A C call that holds the GIL."""
    return workload.slow_c()


@app.get("/blocked")
def blocked() -> str:
    """Waits out another thread's known hold of the GIL (a ground truth)."""
    return workload.blocked()


@app.get("/health")
def health() -> str:
    """Liveness."""
    return workload.health()

"""The Flask example: no otel-gil code here, opentelemetry-instrument adds it.

    cd examples/flask_app
    OTEL_SERVICE_NAME=flask-gil opentelemetry-instrument flask --app app run --port 8000
    OTEL_SERVICE_NAME=flask-gil opentelemetry-instrument gunicorn -w 2 -b 127.0.0.1:8000 app:app
"""

import os
import sys

from flask import Flask

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # examples/workload.py
import workload  # noqa: E402

app = Flask(__name__)
app.before_request(workload.ensure_hog)


@app.get("/io")
def io():
    return workload.io_bound()


@app.get("/cpu")
def cpu():
    return workload.cpu_bound()


@app.get("/slow_c")
def slow_c():
    return workload.slow_c()


@app.get("/health")
def health():
    return "ok"

"""FastAPI on uvicorn with no OpenTelemetry code (examples/async_app uses the API for its own
spans; an app the Operator instruments has none): ten 2 ms waits on the loop per /io, slow only
when the metrics-collector hog of examples/workload.py keeps the GIL.

    uvicorn --app-dir examples/kube --port 8000 fastapi_app:app
"""

from __future__ import annotations

import asyncio
import os
import sys

from fastapi import FastAPI
from starlette.responses import PlainTextResponse

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # for examples/workload.py
import workload  # noqa: E402

app = FastAPI()


@app.middleware("http")
async def start_the_hog(request, call_next):
    """This process's metrics-collector thread, started on its first request."""
    workload.ensure_hog()
    return await call_next(request)


@app.get("/io", response_class=PlainTextResponse)
async def io() -> str:
    for _ in range(10):
        await asyncio.sleep(0.002)
    return "io done\n"


@app.get("/health", response_class=PlainTextResponse)
async def health() -> str:
    return workload.health()

"""How long an import that turns a free-threaded build's GIL on takes on a request's thread.

Usage: python import_cost.py MODULE SOCKET [--bare]: instrumented (backend auto, the collector's
socket SOCKET) unless ``--bare`` (no otel-gil at all). Prints one JSON document: ``import_ns``
(the import, timed on its thread), ``gil_after`` (sys._is_gil_enabled() after it), and
instrumented, ``measuring``: the backend otel-gil's thread started (after waiting for it).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("module")
    parser.add_argument("socket")
    parser.add_argument("--bare", action="store_true")
    args = parser.parse_args()
    if not args.bare:
        from opentelemetry.sdk.trace import TracerProvider

        from otel_gil import GilInstrumentor

        GilInstrumentor().instrument(tracer_provider=TracerProvider(), socket_path=args.socket, backend="auto")
    took: dict = {}

    def request() -> None:
        t0 = time.perf_counter_ns()
        __import__(args.module)
        took["import_ns"] = time.perf_counter_ns() - t0

    thread = threading.Thread(target=request, name="request")
    thread.start()
    thread.join()
    took["gil_after"] = sys._is_gil_enabled()
    if not args.bare:
        backend = GilInstrumentor._backend
        backend.wait(10)  # a collector that never answers: figures never flow through it
        took["measuring"] = backend.kind  # "auto" until otel-gil's thread started one
    json.dump(took, sys.stdout)


if __name__ == "__main__":
    main()

"""Spans made while the registration flips between a mapped ring (``ok``) and none
(``no_collector``), thread switches provoked at every bytecode they can fall on
(``sys.setswitchinterval(1e-6)``): what each span was measured on, against what was published.

Usage: python registration_flips.py SPANS {python,c}; prints one JSON document: ``published``,
generation -> [ring serial or null, status] as the flipper (the only writer) published them,
and ``spans``, one row per span: [its snapshot's generation, ring serial or null, status,
its ``gil.status`` or null, whether it carries figures]. Runs on any build of the matrix.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

from opentelemetry.sdk.trace import TracerProvider

from otel_gil import ring as ringlib
from otel_gil import spans
from otel_gil.client import Registration
from otel_gil.semconv import GIL_STATUS, GIL_WAIT_MS, NO_COLLECTOR, REGISTERED

MAKERS = 2  # threads making spans, besides the flipper
RINGS = 4
DEADLINE_S = 60


def ring_bytes(nslots: int = 64) -> bytes:
    """A ring's bytes as a collector hands them over: header set, slots empty."""
    data = bytearray(ringlib.SLOT_SIZE * ringlib.entries(nslots))
    header = ringlib.Header.from_buffer(data)
    header.magic, header.layout_version, header.slot_size = ringlib.MAGIC, ringlib.LAYOUT_VERSION, ringlib.SLOT_SIZE
    header.nslots, header.clock_id = nslots, ringlib.CLOCK_MONOTONIC
    header.long_wait_ns, header.convoy_ns, header.hold_record_ns = 1_000_000, 5_000_000, ringlib.HOLD_RECORD_NS
    del header
    return bytes(data)


def serial(ring) -> int | None:
    return None if ring is None else ring.serial


def main() -> None:
    wanted, hooks = int(sys.argv[1]), sys.argv[2]
    sys.setswitchinterval(1e-6)
    registration = Registration("/nonexistent/otel-gil.sock")
    registration.quiet = True
    registration._stop.set()  # no registrar thread: the flipper below plays it
    data, stop = ring_bytes(), threading.Event()
    state = registration.state
    published = {state.generation: (None, state.status)}

    def mapped(n: int) -> ringlib.Ring:
        fd = os.memfd_create("otel-gil-flips")
        try:
            os.write(fd, data)
            ring = ringlib.Ring.map_fd(fd, len(data))
        finally:
            os.close(fd)
        ring.serial = n
        return ring

    rings = [mapped(n) for n in range(RINGS)]  # kept mapped: as many flips as the flipper can make

    def flip() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            for ring, status in ((rings[n % RINGS], REGISTERED), (None, NO_COLLECTOR)):
                registration._set(ring, status, "")
                now = registration.state
                published[now.generation] = (serial(now.ring), now.status)

    rows: list[list] = []
    provider = TracerProvider()
    processor = spans.GilSpanProcessor(registration, None, fast=hooks == "c")
    assert (processor._hooks is not None) == (hooks == "c"), "otel_gil._fastspan is not built for this Python"
    spans.hook_provider(provider, processor)
    tracer = provider.get_tracer("flips")

    def make() -> None:
        while not stop.is_set():
            span = tracer.start_span("x")
            start = span._otel_gil_start
            span.end()
            attributes = span.attributes
            rows.append([start.generation, serial(start.ring), start.status, attributes.get(GIL_STATUS),
                         GIL_WAIT_MS in attributes])

    workers = [threading.Thread(target=flip)] + [threading.Thread(target=make) for _ in range(MAKERS)]
    for worker in workers:
        worker.start()
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline and (len(rows) < wanted or len({row[2] for row in rows}) < 2):
        time.sleep(0.05)
    stop.set()
    for worker in workers:
        worker.join()
    spans.unwrap_span()
    registration.stop()
    json.dump({"published": published, "spans": rows}, sys.stdout)


if __name__ == "__main__":
    main()

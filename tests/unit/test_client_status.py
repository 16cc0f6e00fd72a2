"""Registration against a stand-in collector: a ring whose GIL is never located gives
``gil_not_located`` (never zero figures); one the probes locate gives ``ok``; an error code
this side does not know gives ``collector_error``, never a status of the collector's making."""

import os
import socket
import threading

import pytest

from otel_gil import protocol
from otel_gil.client import Registration
from otel_gil.semconv import COLLECTOR_ERROR, GIL_NOT_LOCATED, REGISTERED
from synthetic import make_ring
from test_spans import hooked


def _listening(tmp_path) -> tuple[socket.socket, str]:
    path = str(tmp_path / "collector.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server.bind(path)
    server.listen()
    return server, path


def _serve_one(server: socket.socket, ring_bytes: bytes) -> None:
    conn, _ = server.accept()
    with conn:
        protocol.receive(conn)
        fd = os.memfd_create("ring")
        try:
            os.write(fd, ring_bytes)
            protocol.send(conn, {"ok": True, "size": len(ring_bytes), "nslots": 64}, (fd,))
        finally:
            os.close(fd)
        conn.recv(1)  # held open, as the collector does, until the client goes


@pytest.mark.parametrize("located, status", [(False, GIL_NOT_LOCATED), (True, REGISTERED)])
def test_status_says_whether_the_gil_was_located(tmp_path, located, status):
    ring = make_ring()
    if located:  # what the BPF side writes once it learned the GIL's condition variables
        ring.header.gil_cond, ring.header.switch_cond = 0x1000, 0x1000 + 88
    data = bytes(ring._bytes)
    server, path = _listening(tmp_path)
    stand_in = threading.Thread(target=_serve_one, args=(server, data), daemon=True)
    stand_in.start()
    registration = Registration(path)
    registration.start()
    try:
        assert registration.wait(10)
        state = registration.state
        assert state.status == status, state.detail
        assert (state.ring is None) == (not located)
        if not located:
            assert "no GIL hand-off" in state.detail
    finally:
        registration.stop()
        server.close()


def _refuse_one(server: socket.socket, answer: dict) -> None:
    conn, _ = server.accept()
    with conn:
        protocol.receive(conn)
        protocol.send(conn, answer)


@pytest.mark.parametrize("fast", [False, True], ids=["python-hooks", "c-hooks"])
def test_an_error_code_unknown_here_is_collector_error(tmp_path, fast):
    server, path = _listening(tmp_path)
    answer = {"ok": False, "error": "quota_exceeded", "message": "come back later"}
    threading.Thread(target=_refuse_one, args=(server, answer), daemon=True).start()
    registration = Registration(path)
    registration.quiet = True
    registration.start()
    try:
        assert registration.wait(10)
        state = registration.state
        assert (state.ring, state.status) == (None, COLLECTOR_ERROR)
        assert state.detail == "the collector answered 'quota_exceeded': come back later"
        with hooked(registration, fast) as (tracer, _, exporter):
            tracer.start_span("refused").end()
        (span,) = exporter.get_finished_spans()
        assert span.attributes["gil.status"] == COLLECTOR_ERROR
    finally:
        registration.stop()
        server.close()

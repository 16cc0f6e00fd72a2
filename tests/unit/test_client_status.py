"""Registration against a stand-in collector: a ring whose GIL is never located gives
``gil_not_located`` (never zero figures); one the probes locate gives ``ok``."""

import os
import socket
import threading

import pytest

from otel_gil import protocol
from otel_gil.client import Registration
from otel_gil.semconv import GIL_NOT_LOCATED, REGISTERED
from synthetic import make_ring


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
    path = str(tmp_path / "collector.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server.bind(path)
    server.listen()
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

"""Message framing: round trips, and every malformed form rejected with a reason."""

import os
import socket
import struct

import pytest

from otel_gil import protocol


def test_round_trip_with_an_fd():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    r, w = os.pipe()
    try:
        protocol.send(a, {"ok": True, "size": 4096}, (r,))
        msg, fds = protocol.receive(b, max_fds=1)
        assert msg == {"ok": True, "size": 4096}
        assert len(fds) == 1 and os.fstat(fds[0]).st_ino == os.fstat(r).st_ino
        os.close(fds[0])
    finally:
        for fd in (r, w):
            os.close(fd)
        a.close()
        b.close()


def test_unexpected_fds_are_closed_and_refused():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    r, w = os.pipe()
    before = len(os.listdir("/proc/self/fd"))
    try:
        protocol.send(a, {"op": "hello"}, (r,))
        with pytest.raises(protocol.ProtocolError, match="unexpected file descriptors"):
            protocol.receive(b, max_fds=0)
        assert len(os.listdir("/proc/self/fd")) == before
    finally:
        for fd in (r, w):
            os.close(fd)
        a.close()
        b.close()


@pytest.mark.parametrize(
    "data, match",
    [
        (b"", "truncated"),
        (b"OGIL\x00", "truncated"),
        (b"XXXX" + struct.pack("!HHI", 1, 0, 2) + b"{}", "bad magic"),
        (b"OGIL" + struct.pack("!HHI", 2, 0, 2) + b"{}", "protocol version 2"),
        (b"OGIL" + struct.pack("!HHI", 1, 0, 3) + b"{}", "length field"),
        (b"OGIL" + struct.pack("!HHI", 1, 0, 3) + b"{x}", "not JSON"),
        (b"OGIL" + struct.pack("!HHI", 1, 0, 2) + b"[]", "not a JSON object"),
        (b"OGIL" + struct.pack("!HHI", 1, 0, 2) + b"\xc3\x28", "not JSON"),
        (b"OGIL" + b"\x00" * (protocol.MAX_MESSAGE), "exceeds"),
    ],
)
def test_malformed(data, match):
    with pytest.raises(protocol.ProtocolError, match=match):
        protocol.decode(data)


def test_version_mismatch_has_its_own_code():
    with pytest.raises(protocol.ProtocolError) as info:
        protocol.decode(b"OGIL" + struct.pack("!HHI", 9, 0, 2) + b"{}")
    assert info.value.code == protocol.UNSUPPORTED_VERSION


def test_oversized_payload_is_refused_before_sending():
    with pytest.raises(protocol.ProtocolError):
        protocol.encode({"x": "y" * protocol.MAX_MESSAGE})


def test_deeply_nested_json_is_a_protocol_error_not_a_crash():
    body = b"[" * 4000
    with pytest.raises(protocol.ProtocolError, match="not JSON"):
        protocol.decode(b"OGIL" + struct.pack("!HHI", 1, 0, len(body)) + body)

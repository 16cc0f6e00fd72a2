"""The registration protocol between an app (client) and the collector.

One message per SOCK_SEQPACKET datagram: a fixed binary header (magic, protocol
version, payload length) and a JSON object. Messages are bounded; anything
malformed is rejected with a precise error and never trusted for identity (the
collector takes the pid from SO_PEERCRED). The collector answers a ``hello``
with ``ok`` plus the read-only ring fd (SCM_RIGHTS), or ``ok: false`` with an
error code and a message meant for the app's log.
"""

from __future__ import annotations

import array
import json
import socket
import struct

from otel_gil.semconv import (ATTACH_FAILED, BAD_REQUEST, COLLECTOR_ERROR, GIL_DISABLED, INTERNAL, PROCESS_GONE,
                              TOO_MANY_PROCESSES, UNSUPPORTED_INTERPRETER, UNSUPPORTED_VERSION)

VERSION = 1
MAGIC = b"OGIL"
MAX_MESSAGE = 4096
_HEADER = struct.Struct("!4sHHI")  # magic, version, reserved, payload length

# The error codes a collector answers with: each is the ``gil.status`` of the app's spans then.
ERRORS = frozenset({BAD_REQUEST, UNSUPPORTED_VERSION, UNSUPPORTED_INTERPRETER, GIL_DISABLED, ATTACH_FAILED,
                    TOO_MANY_PROCESSES, PROCESS_GONE, INTERNAL})


class ProtocolError(Exception):
    """A message that does not follow this protocol; ``code`` is the error to answer with."""

    def __init__(self, message: str, code: str = BAD_REQUEST) -> None:
        super().__init__(message)
        self.code = code


def refusal(reply: dict) -> tuple[str, str]:
    """The ``gil.status`` and detail of an ``ok: false`` reply: a code this side does not know
    is ``collector_error``, never a status of its own, and is kept in the detail."""
    code, message = str(reply.get("error", INTERNAL))[:64], str(reply.get("message", ""))[:512]
    if code in ERRORS:
        return code, message
    return COLLECTOR_ERROR, f"the collector answered {code!r}: {message}"[:512]


def encode(payload: dict) -> bytes:
    body = json.dumps(payload, separators=(",", ":")).encode()
    data = _HEADER.pack(MAGIC, VERSION, 0, len(body)) + body
    if len(data) > MAX_MESSAGE:
        raise ProtocolError(f"message of {len(data)} B exceeds {MAX_MESSAGE} B")
    return data


def decode(data: bytes) -> dict:
    """The JSON object of one datagram; ProtocolError on anything else."""
    if len(data) < _HEADER.size:
        raise ProtocolError(f"truncated message ({len(data)} B)")
    if len(data) > MAX_MESSAGE:
        raise ProtocolError(f"message exceeds {MAX_MESSAGE} B")
    magic, version, _, length = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ProtocolError("not an otel-gil message (bad magic)")
    if version != VERSION:
        raise ProtocolError(
            f"protocol version {version}, this side speaks {VERSION}: "
            "upgrade otel_gil or the collector so they match",
            UNSUPPORTED_VERSION,
        )
    if length != len(data) - _HEADER.size:
        raise ProtocolError(f"length field says {length} B, payload has {len(data) - _HEADER.size} B")
    try:
        payload = json.loads(data[_HEADER.size :].decode())
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"payload is not JSON: {str(exc)[:100]}") from None
    if not isinstance(payload, dict):
        raise ProtocolError("payload is not a JSON object")
    return payload


def send(sock: socket.socket, payload: dict, fds: tuple[int, ...] = ()) -> None:
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    sock.sendmsg([encode(payload)], ancillary)


def receive(sock: socket.socket, max_fds: int = 0) -> tuple[dict, list[int]]:
    """One message and the fds it carried; extra or unexpected fds are closed, never kept."""
    data, ancdata, flags, _ = sock.recvmsg(MAX_MESSAGE + 1, socket.CMSG_SPACE(max(max_fds, 1) * 4))
    fds = []
    for level, kind, blob in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            got = array.array("i")
            got.frombytes(blob[: len(blob) - len(blob) % 4])
            fds.extend(got)
    try:
        if not data:
            raise ConnectionResetError("peer closed the connection")
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC) or len(fds) > max_fds:
            raise ProtocolError("oversized message or unexpected file descriptors")
        return decode(data), fds
    except Exception:
        for fd in fds:
            _close(fd)
        raise


def _close(fd: int) -> None:
    import os

    try:
        os.close(fd)
    except OSError:
        pass

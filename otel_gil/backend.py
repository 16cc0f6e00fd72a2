"""Which writer fills this process's GIL slots: the collector (root, eBPF) or the
in-process hooks (no privilege). Never both on one ring.

``OTEL_GIL_BACKEND``: ``collector``, ``inprocess``, or ``auto`` (the default): the
collector when one answers on the socket (an operator who deployed one chose
it), else in-process; and in-process while a collector that traced the process is gone.
"""

from __future__ import annotations

import logging
import os
from typing import Optional, Protocol, Union

from otel_gil import free_threading
from otel_gil.client import Registration, State, gil_enabled
from otel_gil.environment_variables import OTEL_GIL_BACKEND
from otel_gil.inprocess import InProcess
from otel_gil.semconv import PENDING, REGISTERED

log = logging.getLogger("otel_gil")

AUTO, INPROCESS, COLLECTOR = "auto", "inprocess", "collector"
KINDS = (AUTO, INPROCESS, COLLECTOR)


class Backend(Protocol):
    """What span hooks and metrics read: ``state``, replaced whole (read it once per use)."""

    kind: str
    state: State

    def stop(self) -> None: ...

    def check_fork(self) -> None:
        """After a fork by any caller (Python's at-fork hooks run only for os.fork): set up for this pid."""


def requested(kind: Optional[str] = None) -> str:
    """The backend asked for (argument, else ``$OTEL_GIL_BACKEND``, else auto)."""
    kind = (kind or os.environ.get(OTEL_GIL_BACKEND) or AUTO).strip().lower()
    if kind not in KINDS:
        log.warning("otel-gil: ignoring %s=%r (one of %s); using auto", OTEL_GIL_BACKEND, kind, ", ".join(KINDS))
        return AUTO
    return kind


def start(kind: Optional[str], socket_path: Optional[str], long_wait_ns: int,
          timeout_s: float) -> Union[Registration, InProcess, free_threading.UntilGilOn]:
    """Start the backend ``kind`` (see :func:`requested`) and return it, figures flowing or status set
    (on a free-threaded build without its GIL: when an import turns it on, see ``free_threading``)."""
    kind = requested(kind)
    if not gil_enabled():
        return free_threading.UntilGilOn(kind, lambda: start(kind, socket_path, long_wait_ns, timeout_s))
    if kind != INPROCESS:
        registration = Registration(socket_path, long_wait_ns)
        registration.quiet = kind == AUTO
        registration.start()
        registration.wait(timeout_s)
        # Still pending: a collector answered and is busy with us; ok: it traces us. With auto,
        # should it go away later, this process traces itself until it is back.
        state = registration.state
        if kind == COLLECTOR or state.status in (PENDING, REGISTERED):
            registration.quiet = False
            if kind == AUTO:
                registration.fallback = InProcess(long_wait_ns)
            return registration
        registration.stop()
        log.debug("otel-gil: no collector (%s: %s); tracing in-process", state.status, state.detail)
    backend = InProcess(long_wait_ns)
    backend.start()
    return backend

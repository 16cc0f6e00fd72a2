"""Environment variables that configure otel_gil (all optional)."""

OTEL_GIL_SOCKET = "OTEL_GIL_SOCKET"
"""Path of the collector's registration socket (default /run/otel-gil/otel-gil.sock)."""

OTEL_GIL_LONG_WAIT_MS = "OTEL_GIL_LONG_WAIT_MS"
"""Waits at least this long become ``gil.wait`` span events (default 1)."""

OTEL_GIL_WAIT_SPANS_MS = "OTEL_GIL_WAIT_SPANS_MS"
"""Waits at least this long also become ``gil.wait`` child spans (default: the interpreter's
switch interval, ``sys.getswitchinterval()``, 5 ms unless changed); 0 turns them off."""

OTEL_GIL_REGISTER_TIMEOUT_S = "OTEL_GIL_REGISTER_TIMEOUT_S"
"""How long ``instrument()`` waits for the first registration before going on (default 2)."""

OTEL_GIL_NO_EXTENSIONS = "OTEL_GIL_NO_EXTENSIONS"
"""Set to 1 to use the Python span hooks even where the C ones (``otel_gil._fastspan``) were built."""

OTEL_GIL_ALL_ATTRIBUTES = "OTEL_GIL_ALL_ATTRIBUTES"
"""Set to 1 to put every figure on every span: ``gil.hold_ratio``, and ``gil.acquisitions``,
``gil.convoy_waits`` and ``gil.others_hold_ms`` also where they are 0 (default: only where they
are not; ``otel_gil.semconv.ALWAYS`` are on every span with figures)."""

DEFAULT_SOCKET = "/run/otel-gil/otel-gil.sock"

OTEL_GIL_BACKEND = "OTEL_GIL_BACKEND"
"""Who measures: ``auto`` (default: the collector if one answers, else in-process), ``inprocess``, ``collector``."""

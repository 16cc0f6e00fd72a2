"""GilInstrumentor: the BaseInstrumentor that wires otel_gil into a TracerProvider."""

from __future__ import annotations

import logging
import os
import sys
from typing import Collection, Optional

from opentelemetry import metrics, trace
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor

from otel_gil import backend, parks, threads, wait_spans
from otel_gil.environment_variables import (
    OTEL_GIL_ALL_ATTRIBUTES,
    OTEL_GIL_LONG_WAIT_MS,
    OTEL_GIL_NO_EXTENSIONS,
    OTEL_GIL_REGISTER_TIMEOUT_S,
    OTEL_GIL_WAIT_SPANS_MS,
)
from otel_gil.metrics import GilMetrics
from otel_gil.package import _instruments
from otel_gil.spans import GilSpanProcessor, hook_provider, unwrap_span
from otel_gil.version import __version__

log = logging.getLogger("otel_gil")


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        log.warning("otel-gil: ignoring %s=%r (not a number); using %s", name, raw, default)
        return default


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")


class GilInstrumentor(BaseInstrumentor):
    """Puts GIL wait and hold time on every span.

    Kwargs of ``instrument()``: ``tracer_provider`` (default: the global one, which
    must be the SDK's), ``meter_provider`` (default: the global one), ``backend`` (``auto``, ``inprocess``
    or ``collector``; default ``$OTEL_GIL_BACKEND`` or auto), ``socket_path`` (default ``$OTEL_GIL_SOCKET``),
    ``long_wait_ms``, ``wait_spans_ms`` (0: no ``gil.wait`` child spans; default
    ``$OTEL_GIL_WAIT_SPANS_MS``, else the switch interval), ``register_timeout_s`` and ``all_attributes``
    (every figure on every span; default ``$OTEL_GIL_ALL_ATTRIBUTES``) (defaults from the environment).
    """

    _backend: Optional[backend.Backend] = None
    _processor: Optional[GilSpanProcessor] = None
    # Kept across uninstrument(), one per meter provider: its meter keeps the instruments.
    _metrics: Optional[GilMetrics] = None
    _meter_provider: Optional[metrics.MeterProvider] = None

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs) -> None:
        provider = kwargs.get("tracer_provider") or trace.get_tracer_provider()
        if not hasattr(provider, "add_span_processor"):
            log.warning(
                "otel-gil: the tracer provider is %s, not the OpenTelemetry SDK's: no GIL figures on spans",
                type(provider).__name__,
            )
            return
        long_wait_ms = kwargs.get("long_wait_ms", _env_float(OTEL_GIL_LONG_WAIT_MS, 1.0))
        timeout = kwargs.get("register_timeout_s", _env_float(OTEL_GIL_REGISTER_TIMEOUT_S, 2.0))
        wait_spans.configure(kwargs.get("wait_spans_ms", _env_float(OTEL_GIL_WAIT_SPANS_MS, sys.getswitchinterval() * 1e3)))
        parks.start(int(long_wait_ms * 1e6))  # a free-threaded build without its GIL: parked time instead
        source = backend.start(kwargs.get("backend"), kwargs.get("socket_path"), int(long_wait_ms * 1e6), timeout)
        fast = not _env_true(OTEL_GIL_NO_EXTENSIONS)
        meter_provider = kwargs.get("meter_provider") or metrics.get_meter_provider()
        gil_metrics = GilInstrumentor._metrics
        if gil_metrics is not None and GilInstrumentor._meter_provider is meter_provider:
            gil_metrics.rebind(source)  # its instruments are registered: the meter keeps the first callbacks
        else:
            gil_metrics = GilMetrics(source, metrics.get_meter(__name__, __version__, meter_provider), fast)
            GilInstrumentor._metrics, GilInstrumentor._meter_provider = gil_metrics, meter_provider
        every = kwargs.get("all_attributes", _env_true(OTEL_GIL_ALL_ATTRIBUTES))
        processor = GilSpanProcessor(source, gil_metrics, fast=fast, every_attribute=every)
        hook_provider(provider, processor)
        threads.watch_starts()  # metrics name a thread even if it exits between two reads
        GilInstrumentor._backend, GilInstrumentor._processor = source, processor

    def _uninstrument(self, **kwargs) -> None:
        unwrap_span()
        wait_spans.configure(0)
        threads.unwatch_starts()
        parks.stop()
        if self._processor is not None:
            self._processor.enabled = False  # the SDK has no remove_span_processor (Python hooks)
        if self._backend is not None:
            self._backend.stop()
        GilInstrumentor._backend = GilInstrumentor._processor = None

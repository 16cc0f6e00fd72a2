"""otel-gil: how long each span's thread waited for, and held, the GIL.

Start the collector (root, once per host), then in the app::

    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from otel_gil import GilInstrumentor

    trace.set_tracer_provider(TracerProvider())
    GilInstrumentor().instrument()

    with trace.get_tracer(__name__).start_as_current_span("work") as span:
        ...  # ends with gil.wait_ms, gil.hold_ms, gil.wait_ratio, ... set

Under ``opentelemetry-instrument`` nothing is needed: the ``gil`` entry point
loads :class:`GilInstrumentor`. Without a collector the app runs untouched;
spans say why they carry no figures in ``gil.status``.

``GilInstrumentor`` is imported lazily so that the root-side collector can use
``otel_gil.ring`` and ``otel_gil.protocol`` without the OpenTelemetry SDK.
"""

from otel_gil.version import __version__

__all__ = ["GilInstrumentor", "__version__"]


def __getattr__(name: str):
    if name == "GilInstrumentor":
        from otel_gil.instrumentor import GilInstrumentor

        return GilInstrumentor
    raise AttributeError(f"module 'otel_gil' has no attribute {name!r}")

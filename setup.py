"""otel_gil's optional C parts; everything else is in pyproject.toml.

- ``otel_gil._inprocess``: the in-process writer of the GIL slots (GOT hooks), the
  backend that needs no root. Without it only the collector can measure.
- ``otel_gil._fastspan``: the span hooks in C. Without them otel_gil uses the same
  hooks in Python, which cost more per span.

Without a C compiler the build goes on without them. Both include
otel_gil/gil_layout.h, the slot layout the collector's BPF program writes too.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(f"otel_gil.{name}", [f"otel_gil/{name}.c"], include_dirs=["otel_gil"], optional=True,
                  depends=["otel_gil/gil_layout.h", "otel_gil/gil_writer.h"])
        for name in ("_inprocess", "_fastspan")
    ]
)

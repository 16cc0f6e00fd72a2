"""otel_gil's C parts and dependencies; everything else is in pyproject.toml.

- ``otel_gil._inprocess``: the in-process writer of the GIL slots (GOT hooks), the
  backend that needs no root. Without it only the collector can measure.
- ``otel_gil._fastspan``: the span hooks in C. Without them otel_gil uses the same
  hooks in Python, which cost more per span. Not built on free-threaded builds: it needs
  the GIL, and importing it there would turn the GIL on for the whole process.
- ``otel_gil._parkcontexts``: free-threaded builds only (``Py_MOD_GIL_NOT_USED``, per-thread
  state): the context-switch charge points of parked time, so that a span on an event loop
  or a greenlet carries its own code's parks. Without it such spans carry none.

The dependencies depend on the build: OpenTelemetry's OTLP exporter, gRPC and HTTP; on
free-threaded builds, for which no grpcio release has a wheel (pip would compile it for tens
of minutes), its HTTP exporter only (README, "Free-threaded builds"), and ``OTLP_HTTP_PTH``.

Both include the headers beside them (otel_gil/*.h: gil_layout.h, the slot layout the
collector's BPF program writes too, and the rest). Built from the sdist without a C
compiler, the build goes on without them (spans then say gil.status=unsupported_interpreter
unless a collector measures); the binary wheels (make wheels) are built with
OTEL_GIL_REQUIRE_EXTENSIONS=1, which makes a part that does not build fail the build.
"""

import glob
import os
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

required = os.environ.get("OTEL_GIL_REQUIRE_EXTENSIONS") == "1"
free_threaded = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
# opentelemetry-instrument's default exporter (OTLP over gRPC; HTTP too), as the design promises
otlp = "opentelemetry-exporter-otlp-proto-http>=1.30" if free_threaded else "opentelemetry-exporter-otlp>=1.30"
# opentelemetry-instrument's OTLP is gRPC unless OTEL_EXPORTER_OTLP_PROTOCOL says otherwise (the
# distro's default, the SDK's), and its distro and configurator run before any instrumentor: on a
# free-threaded build, with no grpcio, nothing would be exported. A .pth file runs at interpreter
# start, before opentelemetry-instrument's sitecustomize: there, and only where gRPC is missing
# and no protocol was chosen, it makes HTTP the default.
OTLP_HTTP_PTH = (
    "import os; exec(\"if 'auto_instrumentation' in os.environ.get('PYTHONPATH', '') and "
    "'OTEL_EXPORTER_OTLP_PROTOCOL' not in os.environ:\\n import importlib.util\\n "
    "if importlib.util.find_spec('grpc') is None: os.environ['OTEL_EXPORTER_OTLP_PROTOCOL'] = 'http/protobuf'\")\n"
)


class BuildPy(build_py):
    """Adds ``otel_gil_otlp_http.pth`` beside the package on a free-threaded build."""

    def run(self):
        super().run()
        if free_threaded and not self.dry_run:
            with open(os.path.join(self.build_lib, "otel_gil_otlp_http.pth"), "w") as pth:
                pth.write(OTLP_HTTP_PTH)


setup(
    cmdclass={"build_py": BuildPy},
    install_requires=[
        "opentelemetry-api>=1.30",
        "opentelemetry-sdk>=1.30",
        "opentelemetry-instrumentation>=0.51b0",
        otlp,
        "wrapt>=1.14",
    ],
    ext_modules=[
        Extension(f"otel_gil.{name}", [f"otel_gil/{source}.c" for source in sources], include_dirs=["otel_gil"],
                  optional=not required, depends=sorted(glob.glob("otel_gil/*.h")))
        for name, sources in (
            ("_inprocess", ["_inprocess", "got_patch"]),
            ("_fastspan", ["_fastspan", "context_switches", "module_switches", "got_patch", "thread_names",
                           "wait_ratios", "cpython_layouts", "long_waits"]),
            ("_parkcontexts", ["park_contexts"]),
        )
        if (name == "_fastspan") != free_threaded or name == "_inprocess"
    ]
)

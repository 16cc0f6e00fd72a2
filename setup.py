"""otel_gil's C parts; everything else is in pyproject.toml.

- ``otel_gil._inprocess``: the in-process writer of the GIL slots (GOT hooks), the
  backend that needs no root. Without it only the collector can measure.
- ``otel_gil._fastspan``: the span hooks in C. Without them otel_gil uses the same
  hooks in Python, which cost more per span.

Both include the headers beside them (otel_gil/*.h: gil_layout.h, the slot layout the
collector's BPF program writes too, and the rest). Built from the sdist without a C
compiler, the build goes on without them (spans then say gil.status=unsupported_interpreter
unless a collector measures); the binary wheels (make wheels) are built with
OTEL_GIL_REQUIRE_EXTENSIONS=1, which makes a part that does not build fail the build.
"""

import glob
import os

from setuptools import Extension, setup

required = os.environ.get("OTEL_GIL_REQUIRE_EXTENSIONS") == "1"
setup(
    ext_modules=[
        Extension(f"otel_gil.{name}", [f"otel_gil/{source}.c" for source in sources], include_dirs=["otel_gil"],
                  optional=not required, depends=sorted(glob.glob("otel_gil/*.h")))
        for name, sources in (
            ("_inprocess", ["_inprocess", "got_patch"]),
            ("_fastspan", ["_fastspan", "context_switches", "module_switches", "got_patch", "thread_names",
                           "wait_ratios", "figure_checks"]),
        )
    ]
)

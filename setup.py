"""The optional C span hooks (otel_gil/_fastspan.c); everything else is in pyproject.toml.

Without a C compiler the build goes on without them and otel_gil uses the same
hooks in Python, which cost more per span.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "otel_gil._fastspan",
            ["otel_gil/_fastspan.c"],
            include_dirs=["collector"],  # gil_layout.h: the slot layout the BPF side writes
            optional=True,
        )
    ]
)

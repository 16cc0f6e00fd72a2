"""otel-gil's root side: the otel-gil-collector distribution.

The collector daemon (``otel-gil-collector``), the BPF writer of the slot layout
(``gil.bpf.c``, compiled against otel_gil's ``gil_layout.h`` and ``gil_writer.h``),
and the root tools that need no cooperation from the target: ``otel-gil report``,
``top`` and ``--timeline``. It uses otel_gil's protocol, ring reader and layout;
otel_gil never imports it.
"""

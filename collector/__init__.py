"""otel-gil's root side, imported as ``otel_gil_collector`` (sources in collector/).

The collector daemon (``otel-gil-collector``), the BPF writer of the slot layout
(``gil.bpf.c``, ``gil_layout.h``), and the root tools that need no cooperation
from the target: ``otel-gil report``, ``top`` and ``--timeline``. It uses
otel_gil's protocol and ring reader; otel_gil never imports it.
"""

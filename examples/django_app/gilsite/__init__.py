"""The Django example's project package (no otel-gil code: ``opentelemetry-instrument`` adds it)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # examples/workload.py

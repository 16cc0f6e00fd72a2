# Two entry points for a new machine (both need root: the collector is eBPF):
#   sudo make demo   collector + instrumented workload, prints the span figures
#   sudo make test   the whole test suite against the real kernel
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

# The oldest OpenTelemetry SDK we support, for the span-hook tests.
SDK_MIN := opentelemetry-api==1.30.0 opentelemetry-sdk==1.30.0 opentelemetry-instrumentation==0.51b0

.PHONY: host venv matrix rootfs tools demo test test-sdk-min bench clean

host:
	scripts/setup-host.sh

$(PY): pyproject.toml setup.py otel_gil/_fastspan.c otel_gil/_inprocess.c collector/gil_layout.h collector/gil_writer.h
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(PY)

venv: $(PY)

demo: host venv
	$(PY) scripts/demo.py

matrix:
	scripts/matrix-venvs.sh

# Debian sid (python3.13-3.15) and bullseye (python3.9, glibc 2.31) trees for the interpreter
# matrix, built once with debootstrap (about 1.5 minutes each) and cached outside the repo.
rootfs:
	scripts/rootfs.sh sid bullseye

# Jaeger and promtool, built once from their Go modules and cached outside the repo.
tools:
	scripts/jaeger.sh path
	scripts/promtool.sh --version

test: host venv matrix rootfs tools test-sdk-min
	$(PY) -m pytest -ra tests

# Every benchmark, side by side in one run each; results in bench/RESULTS.md (minutes; run on an idle machine).
bench: host venv
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) bench/handoff.py --rounds 5
	$(PY) bench/spancost.py --spans 2000 --blocks 30 --rounds 5
	$(PY) bench/webload.py --rounds 10 --seconds 3
	$(PY) bench/peers.py --rounds 3 --seconds 5
	$(PY) bench/scale.py --threads 1000 --processes 100

.venv-sdk-min/bin/python: pyproject.toml
	$(PYTHON) -m venv .venv-sdk-min
	.venv-sdk-min/bin/python -m pip install -q $(SDK_MIN) wrapt pytest
	touch $@

test-sdk-min: .venv-sdk-min/bin/python
	PYTHONPATH=. .venv-sdk-min/bin/python -m pytest -q -p no:cacheprovider tests/unit/test_spans.py tests/unit/test_metrics.py

clean:
	rm -rf $(VENV) .venv-sdk-min .venv-matrix build *.egg-info

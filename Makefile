# Two entry points for a new machine (the collector is eBPF: what needs root runs through
# sudo, or as is when make already runs as root, e.g. in a container or CI):
#   make demo   Jaeger, Prometheus, collector + instrumented workload: span figures, trace URL, alert
#   make test   the whole test suite against the real kernel
PYTHON ?= python3
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
VENV := .venv
PY := $(VENV)/bin/python

# The oldest OpenTelemetry SDK we support, for the span-hook tests.
SDK_MIN := opentelemetry-api==1.30.0 opentelemetry-sdk==1.30.0 opentelemetry-instrumentation==0.51b0

.PHONY: host venv matrix rootfs tools demo test test-sdk-min bench soak clean

host:
	$(SUDO) scripts/setup-host.sh

$(PY): pyproject.toml constraints.txt setup.py otel_gil/_fastspan.c otel_gil/_inprocess.c collector/pyproject.toml otel_gil/gil_layout.h otel_gil/gil_writer.h
	$(PYTHON) -m venv --clear $(VENV)  # afresh: upgrading a venv in place can send pip backtracking
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[test]' -e ./collector
	touch $(PY)

venv: $(PY)

demo: host venv
	$(SUDO) $(PY) scripts/demo.py

matrix:
	scripts/matrix-venvs.sh

# Debian sid (python3.13-3.15) and bullseye (python3.9, glibc 2.31) trees for the interpreter
# matrix, built once with debootstrap (about 1.5 minutes each) and cached outside the repo.
rootfs:
	$(SUDO) scripts/rootfs.sh sid bullseye

# Jaeger, Prometheus and promtool, built once from their Go modules and cached outside the repo.
tools:
	$(SUDO) scripts/jaeger.sh path
	$(SUDO) scripts/prometheus.sh path prometheus
	$(SUDO) scripts/prometheus.sh path promtool

test: host venv matrix rootfs tools test-sdk-min
	$(SUDO) $(PY) -m pytest -ra tests

# The soak for 30 minutes (85 s per build and backend, 20 runs; CI runs 4 s each): every span's
# invariants under thread churn, forks, re-instrumentation and a subinterpreter; what it ran and
# saw in bench/SOAK.md.
soak: host venv matrix rootfs
	$(SUDO) env OTEL_GIL_SOAK_S=85 OTEL_GIL_SOAK_REPORT=bench/SOAK.md $(PY) -m pytest -q tests/integration/test_soak.py

# Every benchmark, side by side in one run each; results in bench/RESULTS.md (minutes; run on an idle machine).
bench: host venv
	$(PY) -m pip install -q -c constraints.txt -e '.[bench]'
	$(SUDO) $(PY) bench/handoff.py --rounds 5
	$(SUDO) $(PY) bench/longhold.py --rounds 5
	$(SUDO) $(PY) bench/spancost.py --spans 2000 --blocks 30 --rounds 5
	$(SUDO) $(PY) bench/webload.py --rounds 20 --seconds 2
	$(SUDO) $(PY) bench/peers.py --rounds 3 --seconds 5
	$(SUDO) $(PY) bench/scale.py --threads 1000 --processes 100

.venv-sdk-min/bin/python: pyproject.toml
	$(PYTHON) -m venv .venv-sdk-min
	.venv-sdk-min/bin/python -m pip install -q $(SDK_MIN) wrapt pytest
	touch $@

test-sdk-min: .venv-sdk-min/bin/python
	PYTHONPATH=. .venv-sdk-min/bin/python -m pytest -q -p no:cacheprovider tests/unit/test_spans.py tests/unit/test_metrics.py

clean:
	rm -rf $(VENV) .venv-sdk-min .venv-matrix build *.egg-info

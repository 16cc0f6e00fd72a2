# Two entry points for a new machine (both need root: the collector is eBPF):
#   sudo make demo   collector + instrumented workload, prints the span figures
#   sudo make test   the whole test suite against the real kernel
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: host venv demo test clean

host:
	scripts/setup-host.sh

$(PY): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(PY)

venv: $(PY)

demo: host venv
	$(PY) scripts/demo.py

test: host venv
	$(PY) -m pytest -ra tests

clean:
	rm -rf $(VENV) build *.egg-info

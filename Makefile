# Two entry points for a new machine (the collector is eBPF: what needs root runs through
# sudo, or as is when make already runs as root, e.g. in a container or CI):
#   make demo      Jaeger, Prometheus, collector + instrumented workload: span figures, trace URL, alert
#   make compose   the same as docker-compose.yml's stack in a real container engine (left running;
#                  make compose-down removes it; make compose-scale: the same at scale)
#   make test      the whole test suite against the real kernel
PYTHON ?= python3
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
VENV := .venv
PY := $(VENV)/bin/python

# The oldest OpenTelemetry SDK we support, for the span-hook tests.
SDK_MIN := opentelemetry-api==1.30.0 opentelemetry-sdk==1.30.0 opentelemetry-instrumentation==0.51b0

.PHONY: host venv matrix rootfs tools wheels images demo compose compose-scale compose-down test test-sdk-min bench soak clean \
	operator-image operator-image-arm64 kube-demo kube-down kube-cluster kube-cluster-down kube-load manifests

host:
	$(SUDO) scripts/setup-host.sh

$(PY): pyproject.toml constraints.txt setup.py $(wildcard otel_gil/*.c otel_gil/*.h) collector/pyproject.toml
	$(PYTHON) -m venv --clear $(VENV)  # afresh: upgrading a venv in place can send pip backtracking
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[test]' -e ./collector
	touch $(PY)

venv: $(PY)

demo: host venv
	$(SUDO) $(PY) scripts/demo.py

# docker-compose.yml in Docker, else podman (scripts/engine.sh installs it and serves the Docker
# API), base images pulled or built here once (scripts/images.sh, cached in /var/cache/otel-gil).
compose: host wheels
	$(SUDO) $(PYTHON) scripts/compose.py up

# The stack at scale (docker-compose.scale.yml; README: "Sampling at scale"): requests across two
# services, a loadbalancing tier over two tail samplers; the slowest cross-service traces.
compose-scale: host wheels
	$(SUDO) $(PYTHON) scripts/compose.py up --scale

# Those base images alone, for the tests (Python from source is the long one: 6 CPU minutes).
images: host
	$(SUDO) scripts/images.sh $$($(SUDO) scripts/engine.sh name)

compose-down:
	$(SUDO) $(PYTHON) scripts/compose.py down

# The interpreter matrix's venvs (.venv-matrix/), from pyenv's CPythons and free-threaded ones
# built from source once by scripts/freethreaded.sh (6-15 minutes on 2 cores), cached outside the repo.
matrix:
	$(SUDO) scripts/freethreaded.sh 3.13 >/dev/null
	scripts/matrix-venvs.sh

# Debian sid (python3.13-3.15) and bullseye (python3.9, glibc 2.31) trees for the interpreter
# matrix, their slim twins with no compiler and an arm64 sid (qemu-user-static) for the wheels'
# tests, built once with debootstrap (1.5-3 minutes each, arm64 about 10) and cached outside the repo.
rootfs:
	$(SUDO) scripts/rootfs.sh sid bullseye sid-slim bullseye-slim sid-arm64

# manylinux2014 wheels (x86_64, aarch64) for pyproject.toml's [tool.otel-gil.wheels], the
# sdist and otel-gil-collector's wheel, into dist/ (scripts/wheels.py; with the pinned tools of
# scripts/wheel-tools.txt; 3.14+ built in sid's tree, which scripts/rootfs.sh makes when missing).
WHEEL_TOOLS := .venv-wheels
WHEEL_SOURCES := setup.py pyproject.toml README.md scripts/wheels.py $(wildcard otel_gil/*.py otel_gil/*.c otel_gil/*.h) \
	collector/pyproject.toml $(wildcard collector/otel_gil_collector/*.py collector/otel_gil_collector/*.c collector/otel_gil_collector/*.h)

$(WHEEL_TOOLS)/bin/python: scripts/wheel-tools.txt
	$(PYTHON) -m venv --clear $(WHEEL_TOOLS)
	$(WHEEL_TOOLS)/bin/python -m pip install -q -r scripts/wheel-tools.txt
	touch $@

build/wheels.stamp: $(WHEEL_TOOLS)/bin/python $(WHEEL_SOURCES)
	$(SUDO) env PATH="$(CURDIR)/$(WHEEL_TOOLS)/bin:$$PATH" $(WHEEL_TOOLS)/bin/python scripts/wheels.py --out dist
	mkdir -p build && touch $@

wheels: host build/wheels.stamp

# Kubernetes (README "Kubernetes"): the OpenTelemetry Operator's Python auto-instrumentation image
# with otel-gil for every CPython of the wheels (deploy/kubernetes/autoinstrumentation-python),
# in the local engine, from the local base images.
# (scripts/kube.py's build_operator_image: the build host's architecture).
operator-image: images wheels
	$(SUDO) $(PY) -c 'import sys; sys.path.insert(0, "scripts"); import kube; kube.build_operator_image()'

# The same for arm64 (its tag ends in -arm64): its tree of the aarch64 wheels, on arm64 busybox.
operator-image-arm64: images wheels
	$(SUDO) $(PY) -c 'import sys; sys.path.insert(0, "scripts"); import kube; kube.build_operator_image("arm64")'

# That image's init container in app Pods (Flask, FastAPI, Django; CPython 3.11 and 3.13) as the
# Operator's webhook writes them, run by podman kube play (scripts/kube.py): their slowest spans
# from Jaeger, like make demo; the Pods stay up until make kube-down removes every Pod and volume.
kube-demo: host venv rootfs tools operator-image
	$(SUDO) $(PY) scripts/kube.py up

kube-down:
	$(SUDO) $(PY) scripts/kube.py down

# A real single-node Kubernetes here (scripts/kube_cluster.py; README "Kubernetes"): etcd, the
# control plane and a kubelet on containerd, built once from k8s.io/kubernetes (scripts/kube-bin.sh);
# its last lines say how to reach it. make kube-load IMAGE=... puts the engine's image on the node.
kube-cluster: host venv
	$(SUDO) $(PY) scripts/kube_cluster.py up

kube-cluster-down:
	$(SUDO) $(PY) scripts/kube_cluster.py down

kube-load:
	$(SUDO) $(PY) scripts/kube_cluster.py load $(IMAGE)

# deploy/kubernetes/'s plain manifests, rendered from the Helm chart deploy/helm/otel-gil.
manifests:
	$(PY) scripts/manifests.py

# Jaeger (its release binary where it downloads, else built from its Go module: scripts/jaeger.sh),
# Prometheus, promtool, helm, Kubernetes' binaries and the OpenTelemetry Operator (built from their Go
# modules: Kubernetes 25 min, the Operator 17 on a loaded 2-core VM), once, cached outside the repo.
tools:
	$(SUDO) scripts/jaeger.sh path
	$(SUDO) scripts/prometheus.sh path prometheus
	$(SUDO) scripts/prometheus.sh path promtool
	$(SUDO) scripts/kube-bin.sh dir helm >/dev/null
	$(SUDO) scripts/kube-bin.sh dir kubernetes >/dev/null
	$(SUDO) scripts/kube-bin.sh dir operator >/dev/null

# --durations: where the minutes went, in CI's log.
test: host venv matrix rootfs tools wheels images test-sdk-min
	$(SUDO) $(PY) -m pytest -ra --durations=30 tests

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
	$(SUDO) $(PY) bench/switches.py --steps 20000 --blocks 30 --rounds 5
	$(SUDO) $(PY) bench/webload.py --rounds 20 --seconds 2
	$(SUDO) $(PY) bench/asyncload.py --rounds 20 --seconds 2
	$(SUDO) $(PY) bench/asyncload.py --rounds 20 --seconds 2 --loop uvloop
	$(SUDO) $(PY) bench/peers.py --rounds 3 --seconds 5
	$(SUDO) $(PY) bench/scale.py --threads 1000 --processes 100

.venv-sdk-min/bin/python: pyproject.toml
	$(PYTHON) -m venv .venv-sdk-min
	.venv-sdk-min/bin/python -m pip install -q $(SDK_MIN) wrapt pytest
	touch $@

test-sdk-min: .venv-sdk-min/bin/python
	PYTHONPATH=. .venv-sdk-min/bin/python -m pytest -q -p no:cacheprovider tests/unit/test_spans.py tests/unit/test_metrics.py

clean:
	rm -rf $(VENV) .venv-sdk-min .venv-matrix $(WHEEL_TOOLS) build dist *.egg-info

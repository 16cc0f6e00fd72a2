#!/usr/bin/env bash
# One virtualenv per CPython of the verified matrix (.venv-matrix/3.X), from pyenv's
# builds, and per free-threaded build (.venv-matrix/3.Xt, from scripts/freethreaded.sh's
# cache: `make matrix` builds them first), with what the test workloads import, and
# otel_gil's C parts built in place for each (ABI-tagged .so files side by side; the
# workloads import otel_gil from the checkout; free-threaded builds have _parkcontexts instead of
# _fastspan).
# Idempotent (a no-op when nothing it reads changed); builds the venvs in parallel.
set -euo pipefail
cd "$(dirname "$0")/.."
root=${PYENV_ROOT:-$HOME/.pyenv}
deps=(opentelemetry-sdk opentelemetry-instrumentation wrapt "setuptools>=77")  # 77: project.license as SPDX
versions=(3.9 3.10 3.11 3.12 3.13 3.13t)
modules() {  # VERSION -> otel_gil's C parts built for it
    case $1 in *t) echo _inprocess _parkcontexts ;; *) echo _inprocess _fastspan ;; esac
}
pids=()
for v in "${versions[@]}"; do
    [ -x ".venv-matrix/$v/bin/python" ] && continue
    case $v in
        *t) py=$(scripts/freethreaded.sh "${v%t}") ;;
        *) py=$(ls -d "$root"/versions/"$v".*/bin/python"$v" 2>/dev/null | sort -V | tail -n 1) ;;
    esac
    [ -n "$py" ] || { echo "matrix-venvs.sh: no pyenv CPython $v under $root (pyenv install $v)" >&2; exit 1; }
    ( "$py" -m venv ".venv-matrix/$v.tmp" && ".venv-matrix/$v.tmp/bin/pip" install -q "${deps[@]}" \
        && rm -rf ".venv-matrix/$v" && mv ".venv-matrix/$v.tmp" ".venv-matrix/$v" ) &
    pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
# uvloop (a wheel for each version), for the tasks scenario on its loop; also in venvs made before.
for v in 3.9 3.10 3.11 3.12 3.13; do
    compgen -G ".venv-matrix/$v/lib/python$v/site-packages/uvloop/__init__.py" >/dev/null \
        || ".venv-matrix/$v/bin/python" -m pip install -q --only-binary uvloop uvloop
done
# uvicorn, its ASGI middleware and greenlet (a cp313t wheel), for the parks' ground truths on a
# shared thread (tests/workloads/parks.py); also in venvs made before.
# (the middleware of the venv's opentelemetry-instrumentation release: pip would upgrade that instead)
for v in 3.13t; do
    compgen -G ".venv-matrix/$v/lib/python${v%t}t/site-packages/greenlet/__init__.py" >/dev/null && continue
    release=$(".venv-matrix/$v/bin/python" -c 'import importlib.metadata as m; print(m.version("opentelemetry-instrumentation"))')
    ".venv-matrix/$v/bin/python" -m pip install -q --only-binary greenlet uvicorn greenlet \
        "opentelemetry-instrumentation-asgi==$release"
done
# Built since the last change to what the build reads, and still there: nothing to do.
built() {
    local stamp=".venv-matrix/$1/.built" m
    [ -e "$stamp" ] || return 1
    for m in $(modules "$1"); do compgen -G "otel_gil/$m.cpython-${1/./}-*.so" >/dev/null || return 1; done
    [ -z "$(find setup.py pyproject.toml scripts/matrix-venvs.sh otel_gil -maxdepth 1 -newer "$stamp" \
                   \( -name '*.[ch]' -o -name setup.py -o -name pyproject.toml -o -name matrix-venvs.sh \))" ]
}
for v in "${versions[@]}"; do
    [ -x ".venv-matrix/$v/bin/python" ] || continue
    built "$v" && continue
    ".venv-matrix/$v/bin/python" -m pip install -q "setuptools>=77"  # venvs made before: 3.9-3.11 bundle an older one
    ".venv-matrix/$v/bin/python" setup.py -q build_ext --inplace >/dev/null 2>&1
    # (an import that turns a free-threaded build's GIL on warns: an error here)
    ".venv-matrix/$v/bin/python" -W error::RuntimeWarning -c 'import importlib, sys
for m in sys.argv[1:]: importlib.import_module("otel_gil." + m)' $(modules "$v") \
        || { echo "matrix-venvs.sh: otel_gil's C parts did not build for $v" >&2; exit 1; }
    touch ".venv-matrix/$v/.built"
done

#!/usr/bin/env bash
# One virtualenv per CPython of the verified matrix (.venv-matrix/3.X), from pyenv's
# builds, with what the test workloads import. Idempotent; builds them in parallel.
set -euo pipefail
cd "$(dirname "$0")/.."
root=${PYENV_ROOT:-$HOME/.pyenv}
deps=(opentelemetry-sdk opentelemetry-instrumentation wrapt)
pids=()
for v in 3.9 3.10 3.11 3.12 3.13; do
    [ -x ".venv-matrix/$v/bin/python" ] && continue
    py=$(ls -d "$root"/versions/"$v".*/bin/python"$v" 2>/dev/null | sort -V | tail -n 1)
    [ -n "$py" ] || { echo "matrix-venvs.sh: no pyenv CPython $v under $root (pyenv install $v)" >&2; exit 1; }
    ( "$py" -m venv ".venv-matrix/$v.tmp" && ".venv-matrix/$v.tmp/bin/pip" install -q "${deps[@]}" \
        && rm -rf ".venv-matrix/$v" && mv ".venv-matrix/$v.tmp" ".venv-matrix/$v" ) &
    pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done

#!/usr/bin/env bash
# The cold path of `make test` (README "Tests": a fresh machine), one build step at a time into
# scratch caches: OTEL_GIL_CACHE and GOCACHE empty (one GOCACHE for all steps, as on a fresh
# machine, so later Go builds reuse what earlier ones compiled), the Python image built --no-cache
# under a scratch tag. Prints per step its CPU seconds (user + sys of it and its children; about
# twice its wall time on 2 idle cores) and its wall time. The shared caches are left alone; Go's
# module cache is used as it is (downloads are not timed here). At nice 10, one step at a time.
# Usage (root, after `make images` made the Python image's base): bench/coldpath.sh [STEP...]
#   steps, in make's order (the default: all): python-image jaeger prometheus promtool helm
#   kubernetes operator freethreaded
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=$(mktemp -d "${TMPDIR:-/tmp}/coldpath.XXXXXX")
export OTEL_GIL_CACHE=$scratch/cache GOCACHE=$scratch/go-build OTEL_GIL_JAEGER_RELEASE=none
engine=$("$root/scripts/engine.sh" name)
tag=localhost/coldpath/python:$(basename "$scratch")
trap 'chmod -R u+w "$scratch"; rm -rf "$scratch"; "$engine" rmi -f "$tag" >/dev/null 2>&1 || true' EXIT

command_of() {  # STEP: the command that builds it
    case $1 in
        python-image) echo "$engine build -q --no-cache -t $tag $root/images/python" ;;
        jaeger) echo "$root/scripts/jaeger.sh path" ;;
        prometheus | promtool) echo "$root/scripts/prometheus.sh path $1" ;;
        helm | kubernetes | operator) echo "$root/scripts/kube-bin.sh dir $1" ;;
        freethreaded) echo "$root/scripts/freethreaded.sh 3.13" ;;
        *) echo "coldpath.sh: unknown step '$1'" >&2; return 1 ;;
    esac
}

steps=("$@")
[ $# -gt 0 ] || steps=(python-image jaeger prometheus promtool helm kubernetes operator freethreaded)
printf '%-14s %8s %8s\n' step "CPU s" "wall s"
for step in "${steps[@]}"; do
    command=$(command_of "$step")
    # shellcheck disable=SC2086
    nice -n 10 /usr/bin/time -o "$scratch/time" -f '%U %S %e' $command >"$scratch/$step.log" 2>&1 \
        || { tail -n 20 "$scratch/$step.log" >&2; exit 1; }
    awk -v step="$step" '{ printf "%-14s %8.0f %8.0f\n", step, $1 + $2, $3 }' "$scratch/time"
done

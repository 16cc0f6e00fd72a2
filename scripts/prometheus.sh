#!/usr/bin/env bash
# Prometheus' server and promtool, built from the one Go module (Prometheus 3.7.3) once and
# cached outside the repo (go install refuses the module for its exclude directives).
#   scripts/prometheus.sh path [prometheus|promtool]   print a binary's path, building it once
#   scripts/prometheus.sh run [args]                   run the server (the caller binds it to loopback)
#   scripts/prometheus.sh promtool [args]              run promtool
# Cache: ${OTEL_GIL_CACHE:-/var/cache/otel-gil}/{prometheus,promtool}-v0.307.3/
# The server is built without its web UI assets (the HTTP API, all tests need, is complete).
set -euo pipefail
version=v0.307.3  # Prometheus 3.7.3
here=$(cd "$(dirname "$0")" && pwd)

# build CMD: print the path of $cache/CMD, building ./cmd/CMD first if it is not there.
build() {
    local cmd=$1 cache=${OTEL_GIL_CACHE:-/var/cache/otel-gil}/$1-$version
    local bin=$cache/$cmd
    mkdir -p "$cache"
    exec 9>"$cache/.lock"
    flock 9  # one build at a time; the others wait and reuse it
    if [ ! -x "$bin" ]; then
        command -v go >/dev/null || { echo "prometheus.sh: Go is needed to build $cmd (apt install golang-go)" >&2; exit 1; }
        echo "prometheus.sh: building $cmd $version from its Go module into $cache (5-10 min on 2 cores)..." >&2
        local src work
        src=$(go mod download -json "github.com/prometheus/prometheus@$version" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
        [ -d "$src" ] || { echo "prometheus.sh: go mod download gave no module dir" >&2; exit 1; }
        work=$(mktemp -d)
        trap 'chmod -R u+w "$work"; rm -rf "$work"' EXIT
        cp -r "$src/." "$work/"
        chmod -R u+w "$work"
        (cd "$work" && "$here/go-build.sh" -o "$bin.tmp" "./cmd/$cmd")
        mv "$bin.tmp" "$bin"  # atomic: an interrupted build never leaves a half binary
        chmod -R u+w "$work"; rm -rf "$work"
        trap - EXIT
    fi
    exec 9>&-
    echo "$bin"
}

case "${1:-path}" in
    path) build "${2:-prometheus}" ;;
    run) shift; bin=$(build prometheus); exec "$bin" "$@" ;;
    promtool) shift; bin=$(build promtool); exec "$bin" "$@" ;;
    *) echo "usage: $0 path [prometheus|promtool] | run [args] | promtool [args]" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# A Jaeger v2 binary built from its Go module, cached outside the repo.
#   scripts/jaeger.sh path         print the binary's path, building it once (~8 min on 2 cores)
#   scripts/jaeger.sh run [args]   run it with scripts/jaeger-config.yaml (loopback only, in memory)
set -euo pipefail

version=v1.76.0
cache=${OTEL_GIL_CACHE:-/var/cache/otel-gil}/jaeger-$version
bin=$cache/jaeger
here=$(cd "$(dirname "$0")" && pwd)

build() {
    command -v go >/dev/null || { echo "jaeger.sh: Go is needed to build Jaeger (apt install golang-go)" >&2; exit 1; }
    echo "jaeger.sh: building Jaeger $version from its Go module into $cache (about 8 min on 2 cores)..." >&2
    mkdir -p "$cache"
    src=$(go mod download -json "github.com/jaegertracing/jaeger@$version" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
    [ -d "$src" ] || { echo "jaeger.sh: go mod download gave no module dir" >&2; exit 1; }
    work=$(mktemp -d)
    trap 'chmod -R u+w "$work"; rm -rf "$work"' EXIT
    cp -r "$src/." "$work/"
    chmod -R u+w "$work"
    (cd "$work" && go build -o "$bin.tmp" ./cmd/jaeger)
    mv "$bin.tmp" "$bin"
    echo "jaeger.sh: built $bin" >&2
}

[ -x "$bin" ] || build
case "${1:-path}" in
    path) echo "$bin" ;;
    run) shift; exec "$bin" --config "$here/jaeger-config.yaml" "$@" ;;
    *) echo "usage: $0 path|run [args]" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# A Jaeger v2 binary built from its Go module, cached outside the repo.
#   scripts/jaeger.sh path         print the binary's path, building it once (~8 min on 2 cores)
#   scripts/jaeger.sh run [args]   run it with scripts/jaeger-config.yaml (loopback only, in memory)
# Cache: ${OTEL_GIL_CACHE:-/var/cache/otel-gil}/jaeger-v1.76.0/jaeger
set -euo pipefail

version=v1.76.0
cache=${OTEL_GIL_CACHE:-/var/cache/otel-gil}/jaeger-$version
bin=$cache/jaeger
here=$(cd "$(dirname "$0")" && pwd)

build() {
    command -v go >/dev/null || { echo "jaeger.sh: Go is needed to build Jaeger (apt install golang-go)" >&2; exit 1; }
    mkdir -p "$cache"
    locked=
    # One build at a time (parallel test runs); whoever waited finds the binary there.
    if command -v flock >/dev/null; then
        exec 9>"$cache/.lock"
        flock 9
        locked=1
        if [ -x "$bin" ]; then exec 9>&-; return; fi
    fi
    echo "jaeger.sh: building Jaeger $version from its Go module into $cache (about 8 min on 2 cores)..." >&2
    start=$SECONDS
    src=$(go mod download -json "github.com/jaegertracing/jaeger@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    [ -d "$src" ] || { echo "jaeger.sh: go mod download gave no module dir" >&2; exit 1; }
    # go install refuses a module with replace directives: build in a writable copy instead.
    work=$(mktemp -d "${TMPDIR:-/tmp}/jaeger-build.XXXXXX")
    tmp=$(mktemp "$cache/.jaeger.XXXXXX")
    trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work" "$tmp"' EXIT
    trap 'exit 130' INT TERM
    cp -r "$src/." "$work/"
    chmod -R u+w "$work"
    (cd "$work" && GOWORK=off GOFLAGS="-mod=mod -buildvcs=false" go build -o "$tmp" ./cmd/jaeger)
    chmod 755 "$tmp"
    mv -f "$tmp" "$bin"  # atomic: an interrupted build never leaves a half binary at $bin
    chmod -R u+w "$work"; rm -rf "$work"
    trap - EXIT INT TERM
    if [ -n "$locked" ]; then exec 9>&-; fi
    echo "jaeger.sh: built $bin in $(( (SECONDS - start) / 60 ))m$(( (SECONDS - start) % 60 ))s" >&2
}

[ -x "$bin" ] || build
case "${1:-path}" in
    path) echo "$bin" ;;
    run) shift; exec "$bin" --config "$here/jaeger-config.yaml" "$@" ;;
    *) echo "usage: $0 path|run [args]" >&2; exit 2 ;;
esac

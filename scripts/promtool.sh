#!/usr/bin/env bash
# Prometheus' promtool, built from its Go module once and cached outside the repo
# (go install refuses the module for its exclude directives).
#   scripts/promtool.sh check rules FILE...   (any promtool arguments)
set -euo pipefail
version=v0.307.3  # Prometheus 3.7.3
cache=${OTEL_GIL_CACHE:-/var/cache/otel-gil}/promtool-$version
bin=$cache/promtool
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9  # one build at a time; the others wait and reuse it
if [ ! -x "$bin" ]; then
    command -v go >/dev/null || { echo "promtool.sh: Go is needed to build promtool" >&2; exit 1; }
    echo "promtool.sh: building promtool $version from its Go module into $cache (5-10 min on 2 cores)..." >&2
    src=$(go mod download -json "github.com/prometheus/prometheus@$version" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
    work=$(mktemp -d)
    trap 'chmod -R u+w "$work"; rm -rf "$work"' EXIT
    cp -r "$src/." "$work/"
    chmod -R u+w "$work"
    (cd "$work" && go build -o "$bin.tmp" ./cmd/promtool)
    mv "$bin.tmp" "$bin"
fi
exec 9>&-
exec "$bin" "$@"

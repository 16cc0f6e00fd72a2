#!/usr/bin/env bash
# Jaeger v2, cached outside the repo: its release binary (the UI inside) where the release archive
# downloads, else a build of its Go module (no UI inside: it serves a UI build where there is one).
#   scripts/jaeger.sh path         print the binary's path (the Go build takes ~8 min on 2 cores, once)
#   scripts/jaeger.sh ui           where its UI comes from, one line: "inside" (the release's),
#                                  "assets DIR" (a UI build it serves) or "none WHY"
#   scripts/jaeger.sh run [args]   run it with scripts/jaeger-config.yaml (loopback only, in memory) and
#                                  its UI; without one, the first line of its log says why
# Environment:
#   OTEL_GIL_JAEGER_RELEASE  where the release's files are (a URL; file:// too), or "none": never the release
#   OTEL_GIL_JAEGER_UI       a build of Jaeger's UI (default ../shared/jaeger-ui/build beside the checkout)
#   OTEL_GIL_CACHE           the cache (default /var/cache/otel-gil): jaeger-2.13.0-linux-ARCH/jaeger, the
#                            release's; jaeger-v1.76.0/jaeger, the Go build
set -euo pipefail

version=v1.76.0  # Jaeger's Go module; Jaeger 2.N is module v1.(63+N), its release tagged with both
minor=${version#v1.}
release=2.$((${minor%%.*} - 63)).${version##*.}
releases=${OTEL_GIL_JAEGER_RELEASE:-https://github.com/jaegertracing/jaeger/releases/download/$version}
here=$(cd "$(dirname "$0")" && pwd)
ui=${OTEL_GIL_JAEGER_UI:-$(cd "$here/../.." && pwd)/shared/jaeger-ui/build}
cache=${OTEL_GIL_CACHE:-/var/cache/otel-gil}
built=$cache/jaeger-$version/jaeger
why=

machine() {  # the release's name for this machine's architecture
    case $(uname -m) in
        x86_64) echo amd64 ;;
        aarch64 | arm64) echo arm64 ;;
        *) return 1 ;;
    esac
}

from_release() {  # $bin: the release's binary, downloaded once, its archive's SHA-256 the one the release lists; else $why
    local arch name tmp sum status=0
    if [ "$releases" = none ]; then why="the release is off (OTEL_GIL_JAEGER_RELEASE=none)"; return 1; fi
    arch=$(machine) || { why="Jaeger releases no binary for $(uname -m)"; return 1; }
    name=jaeger-$release-linux-$arch
    bin=$cache/$name/jaeger
    [ ! -x "$bin" ] || return 0
    # In the cache: the move below is atomic. (set -e does not hold here: every step is checked.)
    tmp=$({ mkdir -p "$cache" && mktemp -d "$cache/.jaeger-release.XXXXXX"; } 2>/dev/null) || { why="$cache is not writable"; return 1; }
    # shellcheck disable=SC2064
    trap "rm -rf '$tmp'" EXIT
    # (Why it did not download, by curl's exit status alone: the image of images.sh keeps the line,
    # which is part of its recipe, and curl's messages can carry timings.)
    curl -fsSL --connect-timeout 10 -o "$tmp/archive" "$releases/$name.tar.gz" 2>/dev/null \
        && curl -fsSL --connect-timeout 10 -o "$tmp/sums" "$releases/jaeger-$release.sha256sum.txt" 2>/dev/null \
        || status=$?
    if [ "$status" != 0 ]; then
        why="its release did not download from $releases (curl's exit status $status)"
    else
        sum=$(sha256sum "$tmp/archive" | cut -d ' ' -f 1)
        if ! awk -v sum="$sum" -v file="$name.tar.gz" '$1 == sum && ($2 == file || $2 == "*" file) { found = 1 } END { exit !found }' "$tmp/sums"; then
            why="the SHA-256 of $releases/$name.tar.gz is not the one its release lists"
        elif ! tar -xzf "$tmp/archive" -C "$tmp" "$name/jaeger" 2>"$tmp/error"; then
            why="$releases/$name.tar.gz has no $name/jaeger ($(tail -n 1 "$tmp/error"))"
        elif ! { chmod 755 "$tmp/$name/jaeger" && mkdir -p "${bin%/*}" && mv -f "$tmp/$name/jaeger" "$bin"; }; then
            why="its binary could not be put at $bin"
        else
            echo "jaeger.sh: Jaeger $release's release binary (its UI inside) is $bin" >&2
        fi
    fi
    rm -rf "$tmp"
    trap - EXIT
    [ -z "$why" ]
}

build() {  # the Go module's build, once, at $built
    local dir=${built%/*} locked= src work tmp start
    command -v go >/dev/null || { echo "jaeger.sh: Go is needed to build Jaeger (apt install golang-go)" >&2; exit 1; }
    mkdir -p "$dir"
    # One build at a time (parallel test runs); whoever waited finds the binary there.
    if command -v flock >/dev/null; then
        exec 9>"$dir/.lock"
        flock 9
        locked=1
        if [ -x "$built" ]; then exec 9>&-; return; fi
    fi
    echo "jaeger.sh: building Jaeger $version from its Go module into $dir (about 8 min on 2 cores)..." >&2
    start=$SECONDS
    src=$(go mod download -json "github.com/jaegertracing/jaeger@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    [ -d "$src" ] || { echo "jaeger.sh: go mod download gave no module dir" >&2; exit 1; }
    # go install refuses a module with replace directives: build in a writable copy instead.
    work=$(mktemp -d "${TMPDIR:-/tmp}/jaeger-build.XXXXXX")
    tmp=$(mktemp "$dir/.jaeger.XXXXXX")
    # shellcheck disable=SC2064
    trap "chmod -R u+w '$work' 2>/dev/null; rm -rf '$work' '$tmp'" EXIT
    trap 'exit 130' INT TERM
    cp -r "$src/." "$work/"
    chmod -R u+w "$work"
    (cd "$work" && "$here/go-build.sh" -o "$tmp" ./cmd/jaeger)
    chmod 755 "$tmp"
    mv -f "$tmp" "$built"  # atomic: an interrupted build never leaves a half binary at $built
    chmod -R u+w "$work"; rm -rf "$work"
    trap - EXIT INT TERM
    if [ -n "$locked" ]; then exec 9>&-; fi
    echo "jaeger.sh: built $built in $(( (SECONDS - start) / 60 ))m$(( (SECONDS - start) % 60 ))s" >&2
}

ui_source() {  # the binary's UI: inside | assets DIR | none WHY
    if [ "$bin" != "$built" ]; then
        echo inside
    elif [ -f "$ui/index.html" ]; then
        echo "assets $(cd "$ui" && pwd)"
    else
        echo "none Jaeger $release built from its Go module has no UI inside, no UI build is at $ui" \
             "(OTEL_GIL_JAEGER_UI names one) and $why: its API answers; its page is Jaeger's placeholder"
    fi
}

if ! from_release; then
    [ -x "$built" ] || build
    bin=$built
fi
case "${1:-path}" in
    path) echo "$bin" ;;
    ui) ui_source ;;
    run)
        shift
        read -r source detail <<<"$(ui_source)"
        assets=()
        case $source in
            assets) assets=("--set=extensions.jaeger_query.ui.assets_path=$detail") ;;
            none) echo "jaeger.sh: no UI: $detail" >&2 ;;
        esac
        exec "$bin" --config "$here/jaeger-config.yaml" "${assets[@]}" "$@" ;;
    *) echo "usage: $0 path|ui|run [args]" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# The trees of otel-gil/autoinstrumentation-python (its Dockerfile runs this in the build stage):
#   build-tree.sh glibc|musl REQUIREMENTS DIR   REQUIREMENTS' wheels for every CPython in VERSIONS,
#       into one `pip install --target` tree: resolved once for the oldest, the others held to
#       those versions, so each package is there once, with a C extension per version beside it;
#       sitecustomize.py beside this script in place of OpenTelemetry's (free-threaded CPythons)
#   build-tree.sh otel-gil DIST DIR              otel-gil's manylinux wheels of DIST (one per CPython and ABI) into DIR
#   build-tree.sh otel-gil-pure DIST DIR         otel-gil's Python code alone into DIR (no C parts)
set -euo pipefail
export PIP_ROOT_USER_ACTION=ignore

VERSIONS="3.10 3.11 3.12 3.13 3.14 3.15"  # what opentelemetry-sdk 1.44 supports (Requires-Python >=3.10)
case ${TREE_ARCH:-$(uname -m)} in  # the target's (the Dockerfile's TARGETARCH), else this machine's
    amd64|x86_64) arch=x86_64 ;;
    arm64|aarch64) arch=aarch64 ;;
    *) echo "build-tree.sh: no wheels for the architecture ${TREE_ARCH:-$(uname -m)}" >&2; exit 2 ;;
esac
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

pip_target() {  # DIR PLATFORM VERSION ARGS...: pip install --target, wheels only, for that interpreter
    local dir=$1 platform=$2 version=$3
    shift 3
    pip install -q --no-cache-dir --disable-pip-version-check --no-compile --target "$dir" --only-binary=:all: \
        --implementation cp --python-version "$version" $platform "$@"
}

merge() {  # FROM INTO: files of FROM that INTO lacks (a version's own .so files, mainly)
    mkdir -p "$2"
    cp -rn "$1/." "$2/"
}

case ${1:-} in
    glibc|musl)
        requirements=$2 tree=$3
        if [ "$1" = glibc ]; then
            platform="--platform manylinux2014_$arch --platform manylinux_2_17_$arch"
        else
            platform="--platform musllinux_1_2_$arch --platform musllinux_1_1_$arch"
        fi
        oldest=${VERSIONS%% *}
        pip_target "$work/$oldest" "$platform" "$oldest" -r "$requirements"
        pip list --disable-pip-version-check --path "$work/$oldest" --format freeze >"$work/pins.txt"
        for version in $VERSIONS; do
            [ "$version" = "$oldest" ] || pip_target "$work/$version" "$platform" "$version" -r "$requirements" -c "$work/pins.txt"
            merge "$work/$version" "$tree"
        done
        twice=$(ls -d "$tree"/*.dist-info | sed 's,.*/,,; s/-[^-]*\.dist-info$//' | sort | uniq -d)
        [ -z "$twice" ] || { echo "build-tree.sh: two versions of $twice in $tree" >&2; exit 1; }
        cp "$(dirname "$0")/sitecustomize.py" "$tree/opentelemetry/instrumentation/auto_instrumentation/" ;;
    otel-gil)
        shopt -s nullglob
        wheels=("$2"/otel_gil-*-cp3*-manylinux*_"$arch".*whl)
        [ ${#wheels[@]} -gt 0 ] || { echo "build-tree.sh: no otel-gil manylinux wheel for $arch in $2: make wheels" >&2; exit 1; }
        for wheel in "${wheels[@]}"; do
            tag=$(basename "$wheel" | cut -d- -f3)  # cp310
            abi=$(basename "$wheel" | cut -d- -f4)  # cp310, or cp313t: a free-threaded build's
            pip_target "$work/one" "--platform manylinux2014_$arch" "3.${tag#cp3}" --abi "$abi" --no-deps "$wheel"
            merge "$work/one" "$3"
            rm -rf "$work/one"
        done ;;
    otel-gil-pure)
        wheel=$(ls "$2"/otel_gil-*-cp311-*manylinux*_"$arch".*whl | head -n 1)
        pip_target "$work/one" "--platform manylinux2014_$arch" 3.11 --no-deps "$wheel"
        find "$work/one" -name '*.so' -delete
        merge "$work/one" "$3" ;;
    *) echo "usage: $0 glibc|musl REQUIREMENTS DIR | otel-gil|otel-gil-pure DIST DIR" >&2; exit 2 ;;
esac

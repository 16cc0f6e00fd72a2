#!/usr/bin/env bash
# Free-threaded CPython (configure --disable-gil --enable-shared, rpath to its own lib) for the
# interpreter matrix, built once from verified sources and cached under
# ${OTEL_GIL_CACHE:-/var/cache/otel-gil}/cpython/VERSIONt-KEY (KEY: a hash of what the build reads):
#   3.13t  CPython 3.13.5 from Debian trixie's orig tarball: trixie's InRelease checked with gpgv
#          against Debian's archive keyring, its Sources.xz against InRelease's SHA-256, the
#          tarball against Sources' SHA-256; any mismatch fails the build
# (3.14t and 3.15t: no source reachable from here; README's table names them untested.)
#
# Usage: scripts/freethreaded.sh VERSION...   builds what is missing (as root; 6-15 minutes
# on 2 cores), prints each interpreter's path (any user, once built). Concurrent builders
# wait on a lock; a failed build leaves nothing behind; a changed recipe builds anew beside
# the old tree.
set -euo pipefail
shopt -s inherit_errexit
. "$(dirname "$0")/debian-pool.sh"
cache=${OTEL_GIL_CACHE:-/var/cache/otel-gil}/cpython
mirror=${OTEL_GIL_DEBIAN_MIRROR:-http://deb.debian.org/debian}
tool=freethreaded.sh
configure_flags=(--disable-gil --enable-shared --with-ensurepip=install)

source_of() {  # VERSION -> the source tarball's name in Debian's pool
    case $1 in
        3.13) echo python3.13_3.13.5.orig.tar.xz ;;
        *) echo "freethreaded.sh: no free-threaded recipe for '$1' (3.13)" >&2; return 1 ;;
    esac
}

fetch_source() {  # VERSION WORKDIR -> the verified tarball's path (downloaded once into the cache)
    debian_source "python$1" "$(source_of "$1")" "$2"
}

build() {  # VERSION PREFIX: configure, make -j2, install into PREFIX through a staging root
    local v=$1 prefix=$2 tarball src start=$SECONDS
    work=$(mktemp -d "$cache/.build-$v.XXXXXX")
    tarball=$(fetch_source "$v" "$work")
    mkdir "$work/src" && tar -xf "$tarball" -C "$work/src" --strip-components=1
    src=$work/src
    echo "freethreaded.sh: $v: configure ${configure_flags[*]}" >&2
    (cd "$src" && ./configure --prefix="$prefix" "${configure_flags[@]}" LDFLAGS="-Wl,-rpath,$prefix/lib") \
        >"$work/build.log" 2>&1 || { tail -n 30 "$work/build.log" >&2; return 1; }
    echo "freethreaded.sh: $v: make -j2 (about 6 minutes on 2 cores; a line per 100 objects)" >&2
    (cd "$src" && make -j2) 2>&1 | tee -a "$work/build.log" \
        | awk -v v="$v" '/ -o [^ ]+\.o( |$)/ && ++n % 100 == 0 {printf "freethreaded.sh: %s: %d objects\n", v, n > "/dev/stderr"}' \
        || { tail -n 30 "$work/build.log" >&2; return 1; }
    (cd "$src" && make install DESTDIR="$work/root") >>"$work/build.log" 2>&1 \
        || { tail -n 30 "$work/build.log" >&2; return 1; }
    LD_LIBRARY_PATH="$work/root$prefix/lib" "$work/root$prefix/bin/python${v}t" \
        -c 'import ssl, zlib, ctypes, pip, sys; assert not sys._is_gil_enabled()' \
        || { echo "freethreaded.sh: $v: the built interpreter lacks ssl, zlib or ctypes, or runs with the GIL" >&2; return 1; }
    mv "$work/root$prefix" "$prefix"
    echo "freethreaded.sh: $v: built in $((SECONDS - start)) s" >&2
}

key_of() {  # VERSION -> a hash of what its build reads: the source (verified), the recipe
    { source_of "$1"; declare -f build; echo "${configure_flags[*]}"; } | sha256sum | cut -c1-12
}

work=
trap '[ -z "$work" ] || rm -rf "$work"' EXIT
for v in "$@"; do
    prefix=$cache/${v}t-$(key_of "$v")
    if [ ! -x "$prefix/bin/python${v}t" ]; then
        mkdir -p "$cache"
        exec 9>"$cache/.lock-$v"
        flock 9
        if [ ! -x "$prefix/bin/python${v}t" ]; then build "$v" "$prefix"; fi
        exec 9>&-
    fi
    echo "$prefix/bin/python${v}t"
done

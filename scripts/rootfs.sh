#!/usr/bin/env bash
# Debian root filesystems whose CPythons the interpreter matrix also runs (tests/helpers.py),
# built once with debootstrap and cached under ${OTEL_GIL_CACHE:-/var/cache/otel-gil}/rootfs:
#   sid       python3.13, python3.14, python3.15 (stripped LTO+PGO, glibc 2.4x)
#   bullseye  python3.9 (glibc 2.31: pthread_cond_* in libpthread.so.0)
# Each has gcc and the interpreters' -dev packages (otel_gil's C parts are built inside it)
# and one venv per interpreter, /opt/venv/3.X, with what the test workloads import.
#
# Usage: scripts/rootfs.sh NAME...   builds what is missing, prints each tree's path
# A build takes 1-3 minutes (network); concurrent callers wait on a lock, a failed build
# leaves nothing behind, and a change to this recipe builds a new tree.
set -euo pipefail
cache=${OTEL_GIL_CACHE:-/var/cache/otel-gil}/rootfs
mirror=${OTEL_GIL_DEBIAN_MIRROR:-http://deb.debian.org/debian}
deps=(opentelemetry-sdk opentelemetry-instrumentation wrapt setuptools)

pythons() {
    case $1 in
        sid) echo 3.13 3.14 3.15 ;;
        bullseye) echo 3.9 ;;
        *) echo "rootfs.sh: unknown root filesystem '$1' (sid, bullseye)" >&2; return 1 ;;
    esac
}

build() {  # NAME DIR
    local name=$1 dir=$2 include=mount,gcc,libc6-dev v
    for v in $(pythons "$name"); do include+=,python$v,python$v-dev,python$v-venv; done
    [ "$name" != bullseye ] || include+=,python3-distutils  # python3.9-venv's virtual dependency
    command -v debootstrap >/dev/null || apt-get install -y -q debootstrap >/dev/null
    debootstrap --variant=minbase --include="$include" "$name" "$dir" "$mirror" >"$cache/$name.log" 2>&1 \
        || { tail -n 20 "$cache/$name.log" >&2; echo "rootfs.sh: debootstrap $name failed (log: $cache/$name.log)" >&2; return 1; }
    cp /etc/resolv.conf "$dir/etc/resolv.conf"
    # pip inside trusts what this machine trusts (a proxy's CA included).
    [ ! -f /etc/ssl/certs/ca-certificates.crt ] || cp /etc/ssl/certs/ca-certificates.crt "$dir/etc/ssl/certs/"
    for v in $(pythons "$name"); do
        # In a mount namespace of its own (/proc for pip), gone when the command ends.
        unshare --mount --fork sh -c 'mount -t proc proc "$1/proc" && exec chroot "$@"' sh "$dir" \
            sh -c "python$v -m venv /opt/venv/$v && /opt/venv/$v/bin/pip install -q --upgrade pip \
                   && /opt/venv/$v/bin/pip install -q ${deps[*]}" \
            || { echo "rootfs.sh: venv for python$v in $name failed" >&2; return 1; }
    done
}

recipe=$(sha256sum <"$0" | cut -c1-12)
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
for name in "$@"; do
    pythons "$name" >/dev/null
    dir=$cache/$name-$recipe
    if [ ! -d "$dir" ]; then
        rm -rf --one-file-system "$cache/$name"-*.tmp
        start=$SECONDS
        echo "rootfs.sh: building $name (1-3 minutes)..." >&2
        build "$name" "$dir.tmp" || { rm -rf --one-file-system "$dir.tmp"; exit 1; }
        mv "$dir.tmp" "$dir"
        echo "rootfs.sh: $name built in $((SECONDS - start)) s" >&2
        for old in "$cache/$name"-*; do  # trees of older recipes (never into a mount left in one)
            [ "$old" = "$dir" ] || rm -rf --one-file-system "$old"
        done
    fi
    echo "$dir"
done

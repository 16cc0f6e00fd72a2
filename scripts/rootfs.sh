#!/usr/bin/env bash
# Debian root filesystems, built once with debootstrap and cached under
# ${OTEL_GIL_CACHE:-/var/cache/otel-gil}/rootfs:
#   sid            python3.13, python3.14, python3.15 (stripped LTO+PGO, glibc 2.4x), for the
#                  interpreter matrix (tests/helpers.py) and for building wheels (scripts/wheels.py)
#   bullseye       python3.9 (glibc 2.31: pthread_cond_* in libpthread.so.0), for the matrix
#   sid-slim       sid's interpreters and nothing to build with: where the wheels are tested
#   bullseye-slim  bullseye's, likewise
#   sid-arm64      sid-slim for arm64, run through qemu-user-static (installed and registered
#                  with binfmt_misc when missing): the aarch64 wheels' smoke test
# The matrix trees have gcc, the interpreters' -dev packages (arm64's too in sid, whose
# multiarch pyconfig.h the aarch64 wheels compile against) and one venv per interpreter,
# /opt/venv/3.X, with what the test workloads import. The slim ones have the interpreters
# and their venv module only: no compiler, no Python.h.
#
# Usage: scripts/rootfs.sh NAME...   builds what is missing, prints each tree's path
# A build takes 1-3 minutes (network; sid-arm64 about 10 under qemu); concurrent callers wait
# on a lock, a failed build leaves nothing behind, and a change to the recipe builds a new
# tree (the old one goes once unused for a day: sessions of another recipe may still run in it).
set -euo pipefail
cache=${OTEL_GIL_CACHE:-/var/cache/otel-gil}/rootfs
mirror=${OTEL_GIL_DEBIAN_MIRROR:-http://deb.debian.org/debian}
deps=(opentelemetry-sdk opentelemetry-instrumentation wrapt setuptools)
deps+=(uvloop)  # the tasks scenario on uvloop's loop too (a wheel for each version)

recipe() {  # NAME -> suite, architecture, kind (dev: the matrix's; slim: the wheels'), pythons
    case $1 in
        sid) echo sid amd64 dev 3.13 3.14 3.15 ;;
        bullseye) echo bullseye amd64 dev 3.9 ;;
        sid-slim) echo sid amd64 slim 3.13 3.14 3.15 ;;
        bullseye-slim) echo bullseye amd64 slim 3.9 ;;
        sid-arm64) echo sid arm64 slim 3.13 3.14 3.15 ;;
        *) echo "rootfs.sh: unknown root filesystem '$1' (sid, bullseye, sid-slim, bullseye-slim, sid-arm64)" >&2
           return 1 ;;
    esac
}

in_tree() {  # DIR COMMAND: in a mount namespace of its own with /proc (pip, apt), gone when it ends
    unshare --mount --fork sh -c 'mount -t proc proc "$1/proc" && exec chroot "$@"' sh "$1" sh -c "$2"
}

qemu_arm64() {  # arm64 binaries run through qemu-user-static, also inside a chroot (binfmt flag F)
    [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] && return
    command -v update-binfmts >/dev/null && [ -e /usr/bin/qemu-aarch64-static ] \
        || DEBIAN_FRONTEND=noninteractive apt-get install -y -q qemu-user-static binfmt-support >/dev/null
    mountpoint -q /proc/sys/fs/binfmt_misc || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
    update-binfmts --enable qemu-aarch64
}

build() {  # NAME DIR
    local name=$1 dir=$2 suite arch kind pythons include=mount v
    read -r suite arch kind pythons <<<"$(recipe "$name")"
    for v in $pythons; do include+=,python$v,python$v-venv; done
    [ "$kind" != dev ] || for v in $pythons; do include+=,python$v-dev; done
    [ "$kind" != dev ] || include+=,gcc,libc6-dev
    [ "$suite" != bullseye ] || include+=,python3-distutils  # python3.9-venv's virtual dependency
    [ "$arch" = amd64 ] || qemu_arm64
    command -v debootstrap >/dev/null || apt-get install -y -q debootstrap >/dev/null
    debootstrap --variant=minbase --arch="$arch" --include="$include" "$suite" "$dir" "$mirror" >"$cache/$name.log" 2>&1 \
        || { tail -n 20 "$cache/$name.log" >&2; echo "rootfs.sh: debootstrap $name failed (log: $cache/$name.log)" >&2; return 1; }
    cp /etc/resolv.conf "$dir/etc/resolv.conf"
    # pip inside trusts what this machine trusts (a proxy's CA included).
    [ ! -f /etc/ssl/certs/ca-certificates.crt ] || cp /etc/ssl/certs/ca-certificates.crt "$dir/etc/ssl/certs/"
    [ "$kind" = dev ] || return 0
    if [ "$suite" = sid ]; then
        local arm64=""
        for v in $pythons; do arm64+=" libpython$v-dev:arm64"; done
        # (the mirror's sid Release file may be past its Valid-Until: debootstrap does not check it, apt does)
        in_tree "$dir" "dpkg --add-architecture arm64 && apt-get -q -o Acquire::Check-Valid-Until=false update && apt-get install -y -q --no-install-recommends $arm64" \
            >>"$cache/$name.log" 2>&1 || { echo "rootfs.sh: arm64 headers in $name failed (log: $cache/$name.log)" >&2; return 1; }
    fi
    for v in $pythons; do
        in_tree "$dir" "python$v -m venv /opt/venv/$v && /opt/venv/$v/bin/pip install -q --upgrade pip \
                        && /opt/venv/$v/bin/pip install -q ${deps[*]}" \
            || { echo "rootfs.sh: venv for python$v in $name failed" >&2; return 1; }
    done
}

# A tree is rebuilt when what makes it changes (the functions above, the packages, the mirror).
recipe_hash=$({ declare -f recipe in_tree qemu_arm64 build; echo "${deps[*]} $mirror"; } | sha256sum | cut -c1-12)
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9
for name in "$@"; do
    recipe "$name" >/dev/null
    dir=$cache/$name-$recipe_hash
    if [ ! -d "$dir" ]; then
        # A build that was killed (debootstrap mounts /proc in its target) leaves mounts in its
        # half-made tree: detach them (we hold the lock: no build runs), then remove it.
        for tmp in "$cache/$name"-*.tmp; do
            [ -d "$tmp" ] || continue
            findmnt -rn -o TARGET | grep -F "$tmp/" | sort -r | xargs -r -n 1 umount -l
            rm -rf --one-file-system "$tmp"
        done
        start=$SECONDS
        echo "rootfs.sh: building $name (1-10 minutes)..." >&2
        build "$name" "$dir.tmp" || { rm -rf --one-file-system "$dir.tmp"; exit 1; }
        mv "$dir.tmp" "$dir"
        echo "rootfs.sh: $name built in $((SECONDS - start)) s" >&2
    fi
    touch "$dir"  # in use: trees of other recipes unused for a day go (never into a mount left in one)
    # (names are matched whole: sid's old trees are sid-<hash>, not sid-slim-<hash>)
    find "$cache" -maxdepth 1 -regex "$cache/$name-[0-9a-f]*" ! -path "$dir" -mtime +0 \
        -exec rm -rf --one-file-system {} + || echo "rootfs.sh: an old $name tree is left (in use?)" >&2
    echo "$dir"
done

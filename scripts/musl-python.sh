#!/usr/bin/env bash
# CPython on musl for the musl app image (examples/kube/musl.Dockerfile), built once with
# musl-gcc (Debian's musl-tools) from verified sources and cached under
# ${OTEL_GIL_CACHE:-/var/cache/otel-gil}/cpython/VERSION-musl-KEY (KEY: a hash of what the build reads):
#   3.13  CPython 3.13.5 and what an app needs of C libraries: zlib (wheels), libffi (ctypes),
#         each trixie's orig tarball verified as freethreaded.sh's (scripts/debian-pool.sh), built
#         static (-fPIC) into the extension modules: at run time the tree needs musl's libc alone
#         (/lib/ld-musl-x86_64.so.1). No OpenSSL: it was 80 % of the build, and the app (Flask on
#         waitress) and the Operator's tree run without `ssl` (hashlib has its own digests).
# No PGO or LTO, no ensurepip (pip runs on the host: pip install --target of musllinux wheels),
# no test modules or test suite: a test image's interpreter, on a fresh machine's cold path.
#
# Usage: scripts/musl-python.sh VERSION...   builds what is missing (as root: installs musl-tools, autotools;
# about 2 minutes on 2 cores), prints each interpreter's path. Concurrent builders wait on a lock;
# a failed build leaves nothing behind; a changed recipe builds anew beside the old tree.
set -euo pipefail
shopt -s inherit_errexit
. "$(dirname "$0")/debian-pool.sh"
cache=${OTEL_GIL_CACHE:-/var/cache/otel-gil}/cpython
mirror=${OTEL_GIL_DEBIAN_MIRROR:-http://deb.debian.org/debian}
tool=musl-python.sh
cflags="-O2 -fPIC"
# musl's threads get 128 KiB of stack, glibc's 8 MiB: CPython's threads 1 MiB, as Alpine's
stack="-DTHREAD_STACK_SIZE=0x100000"
configure_flags=(--without-ensurepip --disable-test-modules)
tools=(musl-tools autoconf automake libtool)  # musl-gcc; libffi's orig tarball has no configure
# trixie's orig tarballs: PACKAGE TARBALL (a superseded one leaves trixie's pool: update the pin)
sources=("python3.13 python3.13_3.13.5.orig.tar.xz" "zlib zlib_1.3.dfsg+really1.3.1.orig.tar.gz"
         "libffi libffi_3.4.8.orig.tar.gz")

unpack() {  # PACKAGE TARBALL -> its sources' directory in the build's workdir
    local tarball
    tarball=$(debian_source "$1" "$2" "$work")
    mkdir "$work/$1" && tar -xf "$tarball" -C "$work/$1" --strip-components=1
    echo "$work/$1"
}

step() {  # WHAT DIR COMMAND...: COMMAND in DIR, logged; the log's tail if it fails
    local what=$1 dir=$2
    shift 2
    echo "musl-python.sh: $what" >&2
    (cd "$dir" && "$@") >>"$work/build.log" 2>&1 \
        || { tail -n 30 "$work/build.log" >&2; echo "musl-python.sh: $what failed (log above)" >&2; return 1; }
}

build() {  # VERSION PREFIX: the libraries into $work/deps, then CPython into PREFIX through a staging root
    local v=$1 prefix=$2 deps start=$SECONDS src entry
    work=$(mktemp -d "$cache/.build-$v-musl.XXXXXX")
    deps=$work/deps
    for entry in "${sources[@]}"; do unpack $entry >/dev/null; done
    mkdir "$work/kernel"  # the kernel's headers (Debian's linux-libc-dev) without glibc's beside them
    ln -s /usr/include/linux /usr/include/asm-generic /usr/include/x86_64-linux-gnu/asm "$work/kernel/"
    export CC=musl-gcc CFLAGS="$cflags -isystem $work/kernel" PKG_CONFIG_LIBDIR=$deps/lib/pkgconfig PKG_CONFIG_PATH=
    step "zlib" "$work/zlib" sh -c "./configure --static --prefix=$deps && make -j2 libz.a && make install"
    step "libffi" "$work/libffi" sh -c "autoreconf -fi && ./configure --prefix=$deps --disable-shared --with-pic --disable-docs \
        --disable-multi-os-directory && make -j2 && make install"
    src=$work/python$v
    # Debian's gcc names glibc's multiarch even under musl's specs: configure would take it for a bug
    sed -i 's|MULTIARCH=$($CC --print-multiarch 2>/dev/null)|MULTIARCH=|' "$src/configure"
    step "CPython $v: configure ${configure_flags[*]}" "$src" ./configure --prefix="$prefix" \
        "${configure_flags[@]//\$deps/$deps}" CPPFLAGS="-I$deps/include -isystem $work/kernel" LDFLAGS="-L$deps/lib" CFLAGS_NODIST="$stack"
    step "CPython $v: make -j2 (about 3 minutes)" "$src" make -j2
    step "CPython $v: install" "$src" make install DESTDIR="$work/root"
    "$work/root$prefix/bin/python$v" -c 'import zlib, ctypes, hashlib, _socket, select, sysconfig
assert sysconfig.get_config_var("EXT_SUFFIX").endswith("-linux-musl.so"), sysconfig.get_config_var("EXT_SUFFIX")' \
        || { echo "musl-python.sh: $v: the built interpreter lacks zlib, ctypes or hashlib, or is not musl's" >&2; return 1; }
    mv "$work/root$prefix" "$prefix"
    echo "musl-python.sh: $v: built in $((SECONDS - start)) s" >&2
}

have_tools() {  # whether musl-gcc, autoreconf and libtoolize are there
    local t
    for t in musl-gcc autoreconf libtoolize; do command -v "$t" >/dev/null || return 1; done
}

key_of() {  # VERSION -> a hash of what its build reads: the sources (verified), the recipe
    { echo "$1 ${sources[*]} $cflags $stack ${configure_flags[*]}"; declare -f unpack step build; } | sha256sum | cut -c1-12
}

work=
trap '[ -z "$work" ] || rm -rf "$work"' EXIT
for v in "$@"; do
    [ "$v" = 3.13 ] || { echo "musl-python.sh: no musl recipe for '$v' (3.13)" >&2; exit 1; }
    prefix=$cache/$v-musl-$(key_of "$v")
    if [ ! -x "$prefix/bin/python$v" ]; then
        have_tools || DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
            "${tools[@]}" >/dev/null || { echo "musl-python.sh: apt-get install ${tools[*]} failed: install them" >&2; exit 1; }
        mkdir -p "$cache"
        exec 9>"$cache/.lock-$v-musl"
        flock 9
        if [ ! -x "$prefix/bin/python$v" ]; then build "$v" "$prefix"; fi
        exec 9>&-
    fi
    echo "$prefix/bin/python$v"
done

# Sourced by the scripts that build from Debian's verified sources (freethreaded.sh,
# musl-python.sh): trixie's InRelease checked with gpgv against Debian's archive keyring, its
# Sources.xz against InRelease's SHA-256, a tarball against Sources' SHA-256; any mismatch fails.
# Needs: $cache (where tarballs go, under src/), $mirror; the caller's name in $tool.
keyring=/usr/share/keyrings/debian-archive-keyring.gpg

debian_sha256() {  # WORKDIR TARBALL -> its SHA-256 in trixie's Sources index, the index verified once per WORKDIR
    local work=$1 name=$2 sums
    if [ ! -e "$work/Sources" ]; then
        curl -sSfL -o "$work/InRelease" "$mirror/dists/trixie/InRelease"
        gpgv --keyring "$keyring" "$work/InRelease" 2>"$work/gpgv.log" \
            || { cat "$work/gpgv.log" >&2; echo "$tool: trixie's InRelease is not signed by Debian's archive key" >&2; return 1; }
        curl -sSfL -o "$work/Sources.xz" "$mirror/dists/trixie/main/source/Sources.xz"
        sums=$(awk '/^SHA256:/{s=1; next} /^[^ ]/{s=0} s && $3 == "main/source/Sources.xz" {print $1}' "$work/InRelease")
        echo "$sums  $work/Sources.xz" | sha256sum -c --quiet - >&2 \
            || { echo "$tool: trixie's Sources.xz does not match its InRelease" >&2; return 1; }
        xz -dc "$work/Sources.xz" >"$work/Sources"
    fi
    awk -v f="$name" '/^Checksums-Sha256:/{s=1; next} /^[^ ]/{s=0} s && $3 == f {print $1; exit}' "$work/Sources"
}

debian_source() {  # PACKAGE TARBALL WORKDIR -> the verified tarball's path (downloaded once into the cache)
    local package=$1 name=$2 work=$3 sha initial
    sha=$(debian_sha256 "$work" "$name")
    [ -n "$sha" ] || { echo "$tool: $name is not in trixie's Sources index (superseded? update the pin in $tool)" >&2; return 1; }
    initial=${package:0:1}
    [[ $package != lib* ]] || initial=${package:0:4}
    if [ ! -e "$cache/src/$name" ]; then
        mkdir -p "$cache/src"
        curl -sSfL -o "$cache/src/$name.part" "$mirror/pool/main/$initial/$package/$name"
        mv "$cache/src/$name.part" "$cache/src/$name"
    fi
    echo "$sha  $cache/src/$name" | sha256sum -c --quiet - >&2 || {
        rm -f "$cache/src/$name"
        echo "$tool: $name does not match the SHA-256 of trixie's Sources ($sha): removed" >&2
        return 1
    }
    echo "$cache/src/$name"
}

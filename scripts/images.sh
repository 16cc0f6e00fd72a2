#!/usr/bin/env bash
# The base images of docker-compose.yml and of its Dockerfiles: pulled where a registry answers,
# else built here under the same name from the same sources (images/*/Dockerfile says how each is):
#   debian:bookworm-slim                          debootstrap (minbase) from Debian's mirror, slimmed as Debian's image
#   amd64/busybox:1.35.0, arm64v8/busybox:1.35.0  Debian's busybox-static of that architecture, its applets linked in /bin
#   python:3.11-slim-bookworm                     images/python: CPython into /usr/local, as the official image
#   jaegertracing/jaeger:2.13.0                   images/jaeger: scripts/jaeger.sh's binary and its UI (jaeger.sh ui)
#   prom/prometheus:v3.7.3                        images/prometheus: scripts/prometheus.sh's binaries
#   otel/opentelemetry-collector-contrib:0.140.1  images/otelcol: a distribution of the Collector Builder
#
# Usage: scripts/images.sh podman|docker   (the engine that gets them; prints nothing on success)
# OTEL_GIL_IMAGES_PULL=none: an image the engine lacks is built here, never pulled (as where no registry answers).
# A built image is cached like Jaeger's build: ${OTEL_GIL_CACHE:-/var/cache/otel-gil}/images/NAME-HASH.tar,
# HASH of all that makes it (recipe, build context, base image), one build at a time (flock);
# an engine without the image loads the archive, a change to the recipe builds it anew (the
# archives of other recipes go once unused for a day).
# The local images trust what this host trusts (its CA bundle, an intercepting proxy's CA
# included), as scripts/rootfs.sh's trees do: apt and pip in later builds reach what the host reaches.
set -euo pipefail

engine=${1:?usage: scripts/images.sh podman|docker}
root=$(cd "$(dirname "$0")/.." && pwd)
gil_cache=${OTEL_GIL_CACHE:-/var/cache/otel-gil}
cache=$gil_cache/images
mirror=${OTEL_GIL_DEBIAN_MIRROR:-http://deb.debian.org/debian}
label=org.otel-gil.recipe
builder=go.opentelemetry.io/collector/cmd/builder@v0.140.0  # the Collector Builder of images/otelcol/manifest.yaml
work=$(mktemp -d "${TMPDIR:-/tmp}/otel-gil-images.XXXXXX")
trap 'rm -rf "$work"' EXIT

recipe_of() {  # IMAGE: the recipe hash it was built from, "" if pulled, "missing" if absent
    "$engine" image inspect --format "{{ index .Config.Labels \"$label\" }}" "$1" 2>/dev/null | sed 's/<no value>//' \
        || echo missing
}

debian_tree() {  # DIR: bookworm as Debian's slim image has it (no docs, man pages or locales; apt cleans up)
    local dir=$1
    command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null
    debootstrap --variant=minbase bookworm "$dir" "$mirror" >"$work/debootstrap.log" 2>&1 \
        || { tail -n 20 "$work/debootstrap.log" >&2; echo "images.sh: debootstrap bookworm failed (see above)" >&2; exit 1; }
    printf '%s\n' 'path-exclude /usr/share/doc/*' 'path-include /usr/share/doc/*/copyright' 'path-exclude /usr/share/man/*' \
        'path-exclude /usr/share/groff/*' 'path-exclude /usr/share/info/*' 'path-exclude /usr/share/locale/*' \
        'path-exclude /usr/share/lintian/*' 'path-exclude /usr/share/linda/*' >"$dir/etc/dpkg/dpkg.cfg.d/docker"
    find "$dir/usr/share/doc" -mindepth 1 ! -name copyright ! -type d -delete
    find "$dir/usr/share/doc" -mindepth 1 -type d -empty -delete
    rm -rf "$dir"/usr/share/{man,groff,info,locale,lintian,linda}/*
    printf '%s\n' 'DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/*.bin || true"; };' \
        'APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/*.bin || true"; };' \
        'Dir::Cache::pkgcache ""; Dir::Cache::srcpkgcache "";' >"$dir/etc/apt/apt.conf.d/docker-clean"
    echo 'Acquire::Languages "none";' >"$dir/etc/apt/apt.conf.d/docker-no-languages"
    echo 'Apt::AutoRemove::SuggestsImportant "false";' >"$dir/etc/apt/apt.conf.d/docker-autoremove-suggests"
    rm -f "$dir/etc/apt/sources.list"
    printf 'Types: deb\nURIs: %s\nSuites: bookworm bookworm-updates\nComponents: main\nSigned-By: %s\n\nTypes: deb\nURIs: %s\nSuites: bookworm-security\nComponents: main\nSigned-By: %s\n' \
        "$mirror" /usr/share/keyrings/debian-archive-keyring.gpg "${mirror%/debian}/debian-security" \
        /usr/share/keyrings/debian-archive-keyring.gpg >"$dir/etc/apt/sources.list.d/debian.sources"
    mkdir -p "$dir/usr/local/share/ca-certificates"
    cp /etc/ssl/certs/ca-certificates.crt "$dir/usr/local/share/ca-certificates/host.crt"
    rm -rf "$dir"/var/lib/apt/lists/* "$dir"/var/cache/apt/*.bin "$dir"/var/cache/apt/archives/*.deb "$dir"/var/log/*.log \
        "$dir"/var/log/apt/* "$dir/etc/resolv.conf" "$dir/etc/hostname"
    : >"$dir/etc/machine-id"
}

from_tree() {  # IMAGE HASH: debian_tree, imported as IMAGE with the official image's config (PATH, CMD)
    local tree=$work/tree official_path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    debian_tree "$tree"
    tar -C "$tree" --numeric-owner -c . \
        | "$engine" import --change "ENV PATH=$official_path" --change 'CMD ["bash"]' --change "LABEL $label=$2" - "$1" >/dev/null
}

from_busybox() {  # IMAGE HASH: the official busybox image of IMAGE's architecture, of bookworm's busybox-static
    local arch=${1#*.io/} apt=$work/apt tree=$work/busybox applet variant=()
    rm -rf "$apt" "$tree"
    arch=${arch%%/*}; arch=${arch%v8}  # amd64, arm64 (the official per-architecture repositories' names)
    mkdir -p "$apt/lists/partial" "$apt/archives/partial" "$tree/bin" "$tree/etc" "$tree/tmp" "$tree/root"
    echo "deb [arch=$arch] $mirror bookworm main" >"$apt/sources.list"
    # apt of this host on a private list: the package verified against Debian's archive key, the host's state untouched
    local opts=(-o "Dir::Etc::SourceList=$apt/sources.list" -o Dir::Etc::SourceParts=/nonexistent -o "Dir::Cache=$apt"
                -o "Dir::State::Lists=$apt/lists" -o Dir::State::Status=/dev/null -o "APT::Architecture=$arch"
                -o "APT::Architectures=$arch" -q)
    apt-get "${opts[@]}" update >"$work/apt.log" 2>&1 && (cd "$apt" && apt-get "${opts[@]}" download "busybox-static:$arch") \
        >>"$work/apt.log" 2>&1 || { cat "$work/apt.log" >&2; echo "images.sh: busybox-static:$arch not fetched (see above)" >&2; exit 1; }
    dpkg-deb -x "$apt"/busybox-static_*.deb "$apt/deb"
    cp "$apt/deb/bin/busybox" "$tree/bin/"
    for applet in $("$tree/bin/busybox" --list); do  # arm64's under qemu-user-static (scripts/rootfs.sh registers it)
        [ -e "$tree/bin/$applet" ] || ln -s busybox "$tree/bin/$applet"
    done
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/false\n' >"$tree/etc/passwd"
    printf 'root:x:0:\nnobody:x:65534:\n' >"$tree/etc/group"
    chmod 1777 "$tree/tmp"
    [ "$arch" = amd64 ] || variant=(--variant v8)  # the variant an engine matches --platform linux/arm64 against
    tar -C "$tree" --numeric-owner -c . | "$engine" import -q --arch "$arch" "${variant[@]}" --change 'CMD ["sh"]' \
        --change "LABEL $label=$2" - "$1" >/dev/null
}

from_context() {  # IMAGE HASH: docker build of $work/context
    "$engine" build -q --label "$label=$2" -t "$1" "$work/context" >/dev/null
}

otelcol() {  # the Collector Builder's distribution of images/otelcol/manifest.yaml, built once: its path
    local dir bin pinned=$root/images/otelcol/unlisted.sum unlisted
    dir=$gil_cache/otelcol-$(cat "$root/images/otelcol/manifest.yaml" "$pinned" | sha256sum | cut -c1-12)
    bin=$dir/otelcol-contrib
    if [ ! -x "$bin" ]; then
        command -v go >/dev/null || { echo "images.sh: Go is needed to build the OpenTelemetry Collector (apt install golang-go)" >&2; exit 1; }
        echo "images.sh: building the OpenTelemetry Collector ($builder) into $dir (about 5 min)..." >&2
        mkdir -p "$dir"
        # The modules the checksum database does not answer for: unchecked by Go, checked against unlisted.sum.
        unlisted=$(grep -v '^#' "$pinned" | cut -d' ' -f1 | sort -u | paste -sd, -)
        (cd "$work" && GOFLAGS=-buildvcs=false GONOSUMDB=$unlisted go run "$builder" --config "$root/images/otelcol/manifest.yaml" >"$work/builder.log" 2>&1) \
            || { tail -n 20 "$work/builder.log" >&2; echo "images.sh: the Collector Builder failed (see above)" >&2; exit 1; }
        for module in ${unlisted//,/ }; do
            diff <(grep "^$module " "$pinned") <(grep "^$module " "$work/otelcol/go.sum") >&2 \
                || { echo "images.sh: $module's checksums are not those of $pinned (see above)" >&2; exit 1; }
        done
        mv "$work/otelcol/otelcol-contrib" "$bin.tmp"
        mv "$bin.tmp" "$bin"  # atomic: an interrupted build never leaves half a binary at $bin
    fi
    echo "$bin"
}

context() {  # IMAGE: $work/context, the image's build context (its Dockerfile and what it copies)
    local source detail
    rm -rf "$work/context"
    cp -r "$root/images/$(dir_of "$1")" "$work/context"
    case $1 in
        */jaeger:*)
            cp "$("$root/scripts/jaeger.sh" path)" "$work/context/jaeger"
            mkdir "$work/context/ui"  # the UI build the image serves, or the one line that says why it has none
            read -r source detail <<<"$("$root/scripts/jaeger.sh" ui)"
            case $source in
                assets) cp -r "$detail/." "$work/context/ui/" ;;
                none) echo "$detail" >"$work/context/ui/none"
                      echo "images.sh: $1 without a UI: $detail" >&2 ;;
            esac ;;
        */prometheus:*)
            cp "$("$root/scripts/prometheus.sh" path prometheus)" "$("$root/scripts/prometheus.sh" path promtool)" "$work/context/" ;;
        */opentelemetry-collector-contrib:*)
            cp "$(otelcol)" "$work/context/" ;;
    esac
    chmod -R u+w "$work/context"  # the same recipe hash whether a source was read-only (a CI's shared/) or not
}

dir_of() {  # IMAGE: its recipe's directory under images/
    case $1 in
        */python:*) echo python ;;
        */jaeger:*) echo jaeger ;;
        */prometheus:*) echo prometheus ;;
        */opentelemetry-collector-contrib:*) echo otelcol ;;
    esac
}

base_of() {  # IMAGE: the image its Dockerfile starts from
    sed -n 's/^FROM //p' "$root/images/$(dir_of "$1")/Dockerfile" | head -n 1
}

recipe() {  # IMAGE: the hash of all that makes it
    if [[ $1 == */busybox:* ]]; then
        { declare -f from_busybox; echo "$1 $mirror"; } | sha256sum | cut -c1-12
    elif [ "$(dir_of "$1")" = "" ]; then
        { declare -f debian_tree from_tree; echo "$mirror"; cat /etc/ssl/certs/ca-certificates.crt; } | sha256sum | cut -c1-12
    else
        context "$1"
        { "$engine" image inspect --format '{{.Id}}' "$(base_of "$1")";
          tar -C "$work/context" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -c .; } | sha256sum | cut -c1-12
    fi
}

ensure() {  # IMAGE: in the engine, pulled or built by this recipe
    local image=$1 have hash slug archive start=$SECONDS
    have=$(recipe_of "$image")
    [ -n "$have" ] || return 0  # pulled: the registry's own
    if [ "$have" = missing ] && [ "${OTEL_GIL_IMAGES_PULL:-}" != none ] && "$engine" pull -q "$image" >/dev/null 2>&1; then
        return 0
    fi
    hash=$(recipe "$image")
    slug=$(echo "${image#docker.io/}" | tr '/:' '__')
    archive=$cache/$slug-$hash.tar
    [ ! -f "$archive" ] || touch "$archive"  # in use: archives of other recipes unused for a day go
    find "$cache" -maxdepth 1 -name "$slug-*.tar" ! -path "$archive" -mtime +0 -delete
    [ "$have" != "$hash" ] || return 0
    if [ ! -f "$archive" ]; then
        echo "images.sh: $image cannot be pulled: building it here (recipe $hash)..." >&2
        case $image in
            */busybox:*) from_busybox "$image" "$hash" ;;
            *) if [ "$(dir_of "$image")" = "" ]; then from_tree "$image" "$hash"; else from_context "$image" "$hash"; fi ;;
        esac
        "$engine" save -o "$archive.tmp" "$image" >/dev/null
        mv "$archive.tmp" "$archive"  # atomic: an interrupted save never leaves half an archive
        echo "images.sh: built $image in $((SECONDS - start)) s" >&2
    else
        "$engine" load -q -i "$archive" >/dev/null
    fi
    [ "$(recipe_of "$image")" = "$hash" ] || { echo "images.sh: $image is not the one $archive holds: remove the archive and retry" >&2; exit 1; }
}

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9  # one build at a time; whoever waited finds the images there
# Bases first: each image's recipe includes its base's id.
for image in docker.io/library/debian:bookworm-slim docker.io/library/python:3.11-slim-bookworm \
             docker.io/amd64/busybox:1.35.0 docker.io/arm64v8/busybox:1.35.0 \
             docker.io/jaegertracing/jaeger:2.13.0 docker.io/prom/prometheus:v3.7.3 \
             docker.io/otel/opentelemetry-collector-contrib:0.140.1; do
    ensure "$image"
done

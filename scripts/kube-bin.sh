#!/usr/bin/env bash
# Kubernetes' and its neighbours' binaries, built from their Go modules once, cached outside the repo.
#   scripts/kube-bin.sh dir kubernetes   kube-apiserver, -controller-manager, -scheduler, kubelet and
#                                        kubectl of k8s.io/kubernetes, in ONE go build (about 15 min on 2 cores)
#   scripts/kube-bin.sh dir operator     the OpenTelemetry Operator's manager
#   scripts/kube-bin.sh dir helm         helm
# Each prints the directory holding the binaries, building them first when missing.
# Cache: ${OTEL_GIL_CACHE:-/var/cache/otel-gil}/{kubernetes,operator,helm}-VERSION/
set -euo pipefail
k8s=v1.34.4  # the newest with containerd 1.x (Debian's 1.6) and cgroup v1 still supported by the kubelet
operator=v0.140.0  # the newest the Go module proxy serves
helm=v3.22.0
here=$(cd "$(dirname "$0")" && pwd)

# build NAME VERSION MODULE OUT PKG...: go build PKGs of MODULE@VERSION into OUT, from a module of ours
# that requires it (go install refuses modules with replace directives, and k8s.io/kubernetes' zip
# lacks the staging modules its replace directives name: they are replaced by their published twins).
build() {
    local name=$1 version=$2 module=$3 out=$4 src work start ldflags=
    shift 4
    command -v go >/dev/null || { echo "kube-bin.sh: Go is needed to build $name (apt install golang-go)" >&2; exit 1; }
    echo "kube-bin.sh: building $name $version from its Go module into $out..." >&2
    start=$SECONDS
    src=$(go mod download -json "$module@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    [ -d "$src" ] || { echo "kube-bin.sh: go mod download gave no module dir for $module@$version" >&2; exit 1; }
    work=$(mktemp -d "${TMPDIR:-/tmp}/kube-bin.XXXXXX")
    # shellcheck disable=SC2064
    trap "rm -rf '$work' '$out.tmp'" EXIT
    # Its go.mod, as ours: the same pins and replacements, the module itself required.
    sed -e "s|^module .*|module otel-gil.invalid/build|" \
        -e "s|=> \./staging/src/\(k8s.io/[a-z0-9-]*\)$|=> \1 v0.${k8s#v1.}|" "$src/go.mod" >"$work/go.mod"
    printf 'require %s %s\n' "$module" "$version" >>"$work/go.mod"
    printf 'package build\n' >"$work/build.go"
    if [ "$name" = kubernetes ]; then
        local v=k8s.io/component-base/version minor=${version#v1.}
        ldflags="-X $v.gitVersion=$version -X $v.gitMajor=1 -X $v.gitMinor=${minor%%.*} -X $v.gitTreeState=clean"
    fi
    rm -rf "$out.tmp" && mkdir -p "$out.tmp"
    (cd "$work" && GO_LDFLAGS=$ldflags "$here/go-build.sh" -o "$out.tmp/" "$@")
    rm -rf "$out" && mv "$out.tmp" "$out"  # an interrupted build never leaves half a set at $out
    rm -rf "$work"
    trap - EXIT
    echo "kube-bin.sh: built $name in $((SECONDS - start)) s" >&2
}

dir() {
    local cache=${OTEL_GIL_CACHE:-/var/cache/otel-gil} out
    case $1 in
        kubernetes) out=$cache/kubernetes-$k8s ;;
        operator) out=$cache/operator-$operator ;;
        helm) out=$cache/helm-$helm ;;
        *) echo "usage: $0 dir kubernetes|operator|helm" >&2; exit 2 ;;
    esac
    if [ -d "$out" ]; then echo "$out"; return; fi  # built: no lock needed (nor write access to the cache)
    mkdir -p "$cache"
    exec 9>"$out.lock"
    flock 9  # one build at a time; the others wait and reuse it
    if [ ! -d "$out" ]; then
        case $1 in
            kubernetes) build kubernetes "$k8s" k8s.io/kubernetes "$out" \
                k8s.io/kubernetes/cmd/{kube-apiserver,kube-controller-manager,kube-scheduler,kubelet,kubectl} ;;
            operator) build operator "$operator" github.com/open-telemetry/opentelemetry-operator "$out" \
                github.com/open-telemetry/opentelemetry-operator ;;
            helm) build helm "$helm" helm.sh/helm/v3 "$out" helm.sh/helm/v3/cmd/helm ;;
        esac
    fi
    exec 9>&-
    echo "$out"
}

case "${1:-}" in
    dir) dir "${2:-}" ;;
    *) echo "usage: $0 dir kubernetes|operator|helm" >&2; exit 2 ;;
esac

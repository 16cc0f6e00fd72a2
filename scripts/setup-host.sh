#!/usr/bin/env bash
# Install what the collector needs on a Debian/Ubuntu host (idempotent; needs root):
# bcc's Python bindings and the running kernel's headers; and what the tests and
# benchmarks drive: chromium (renders timelines), tmux (drives otel-gil top), wrk, valgrind. Kernels without a headers
# package of their own (cloud/VM builds) get the distribution's nearest headers,
# linked where bcc looks for them.
set -euo pipefail

[ "$(id -u)" -eq 0 ] || { echo "setup-host.sh: run as root (sudo)" >&2; exit 2; }
release=$(uname -r)
need=()
dpkg -s python3-bpfcc >/dev/null 2>&1 || need+=(python3-bpfcc)
command -v cc >/dev/null || need+=(gcc)
command -v setpriv >/dev/null || need+=(util-linux)
command -v docker-compose >/dev/null || need+=(docker-compose)  # tests parse docker-compose.yml with it
command -v objcopy >/dev/null || need+=(binutils)
command -v chromium >/dev/null || need+=(chromium)
command -v tmux >/dev/null || need+=(tmux)
command -v wrk >/dev/null || need+=(wrk)
command -v valgrind >/dev/null || need+=(valgrind)  # counts instructions where the CPU has no counters (bench/instructions.py)
dpkg -s catatonit >/dev/null 2>&1 || need+=(catatonit)  # podman kube play's pause image (scripts/kube.py)
# The single-node Kubernetes of scripts/kube-cluster.sh: its node's runtime, network and store.
for package in containerd runc containernetworking-plugins etcd-server; do
    dpkg -s "$package" >/dev/null 2>&1 || need+=("$package")
done
if [ ! -e "/lib/modules/$release/build" ]; then
    apt-get update -qq
    if apt-cache show "linux-headers-$release" >/dev/null 2>&1; then
        need+=("linux-headers-$release")
    else
        need+=(linux-headers-amd64)
    fi
fi
if [ ${#need[@]} -gt 0 ]; then
    echo "setup-host.sh: installing ${need[*]}" >&2
    [ -n "$(find /var/lib/apt/lists -name '*Packages*' -print -quit 2>/dev/null)" ] || apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null || {
        apt-get update -qq  # stale package lists
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
    }
fi
if [ ! -e "/lib/modules/$release/build" ]; then
    # No package for this kernel: link the newest -amd64 headers and their -common twin.
    amd64=$(ls -d /usr/src/linux-headers-*-amd64 | sort -V | tail -n 1)
    common=${amd64%-amd64}-common
    [ -d "$amd64" ] && [ -d "$common" ] || { echo "setup-host.sh: no kernel headers found in /usr/src" >&2; exit 1; }
    mkdir -p "/lib/modules/$release"
    ln -sfn "$amd64" "/lib/modules/$release/build"
    ln -sfn "$common" "/lib/modules/$release/source"
    echo "setup-host.sh: linked /lib/modules/$release/{build,source} to $amd64 (+ -common)" >&2
fi

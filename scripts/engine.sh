#!/usr/bin/env bash
# The container engine that runs docker-compose.yml, and the Compose that drives it (needs root):
#   scripts/engine.sh up     Docker where its daemon answers, else Debian's podman (installed when
#                            missing) with the Docker API served on $sock; prints what it chose as
#                            three lines: engine=..., docker_host=..., compose=...
#   scripts/engine.sh down   stops the API service that `up` started, if it did (nothing else)
set -euo pipefail

sock=/run/podman/podman.sock
pidfile=/run/podman/otel-gil-service.pid  # the API service this script started

[ "$(id -u)" -eq 0 ] || { echo "engine.sh: run as root (sudo)" >&2; exit 2; }

serving() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

up_podman() {
    command -v podman >/dev/null || {
        echo "engine.sh: installing podman (no Docker daemon answers)" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman >/dev/null || {
            apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman >/dev/null
        }
    }
    # podman gives each container RLIMIT_NOFILE 1048576; where this host's hard limit is lower and
    # cannot be raised (no CAP_SYS_RESOURCE, as in some VMs and sandboxes), runc fails with "error
    # setting rlimit type 7: operation not permitted": let containers inherit the host's limits.
    if ! (ulimit -Hn 1048576) 2>/dev/null && ! grep -qs '^default_ulimits *= *\[\]' /etc/containers/containers.conf; then
        mkdir -p /etc/containers
        if grep -qs '^\[containers\]' /etc/containers/containers.conf; then
            sed -i '/^\[containers\]/a default_ulimits = []' /etc/containers/containers.conf
        else
            printf '[containers]\ndefault_ulimits = []\n' >>/etc/containers/containers.conf
        fi
        echo "engine.sh: set default_ulimits = [] in /etc/containers/containers.conf (hard nofile limit $(ulimit -Hn))" >&2
    fi
    if ! serving; then
        mkdir -p "$(dirname "$sock")"
        setsid podman system service --time=0 "unix://$sock" >/run/podman/otel-gil-service.log 2>&1 </dev/null &
        echo $! >"$pidfile"
        for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
        [ -S "$sock" ] || { echo "engine.sh: podman system service did not start: see /run/podman/otel-gil-service.log" >&2; exit 1; }
    fi
    command -v docker-compose >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose >/dev/null
    printf 'engine=podman\ndocker_host=unix://%s\ncompose=docker-compose\n' "$sock"
}

case ${1:-} in
    up)
        if command -v docker >/dev/null && env -u DOCKER_HOST docker info >/dev/null 2>&1; then
            compose="docker compose"
            docker compose version >/dev/null 2>&1 || compose=docker-compose
            printf 'engine=docker\ndocker_host=\ncompose=%s\n' "$compose"
        else
            up_podman
        fi ;;
    down)
        if serving; then
            kill "$(cat "$pidfile")"
            rm -f "$pidfile" "$sock"
        fi ;;
    *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# The container engine that runs docker-compose.yml, and the Compose that drives it (needs root):
#   scripts/engine.sh name   docker where its daemon answers, else podman (Debian's, installed and
#                            set up when missing): prints which
#   scripts/engine.sh up     the same, podman's Docker API served on $sock; prints what it chose as
#                            three lines: engine=..., docker_host=..., compose=...
#   scripts/engine.sh down   stops the API service that `up` started, if it did (nothing else)
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive NEEDRESTART_SUSPEND=1  # apt-get: no questions, no service restarts

sock=/run/podman/podman.sock
pidfile=/run/podman/otel-gil-service.pid  # the API service this script started

[ "$(id -u)" -eq 0 ] || { echo "engine.sh: run as root (sudo)" >&2; exit 2; }

serving() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

docker_answers() { command -v docker >/dev/null && env -u DOCKER_HOST docker info >/dev/null 2>&1; }

setup_podman() {
    command -v podman >/dev/null || {
        echo "engine.sh: installing podman (no Docker daemon answers)" >&2
        local log=/run/podman-install.log
        { apt-get install -y -q podman || { apt-get update -q && apt-get install -y -q podman; }; } </dev/null >"$log" 2>&1 \
            || { tail -n 20 "$log" >&2; echo "engine.sh: apt-get install podman failed (log: $log)" >&2; exit 1; }
    }
    # podman gives each container RLIMIT_NOFILE 1048576; where this host's hard limit is lower and
    # cannot be raised (no CAP_SYS_RESOURCE, as in some VMs and sandboxes), runc fails with "error
    # setting rlimit type 7: operation not permitted": let containers inherit the host's limits.
    local conf=/etc/containers/containers.conf
    if ! (ulimit -Hn 1048576) 2>/dev/null && ! grep -qs '^default_ulimits *= *\[\]' "$conf"; then
        mkdir -p "$(dirname "$conf")"
        if grep -qs '^default_ulimits' "$conf"; then
            sed -i 's/^default_ulimits *=.*/default_ulimits = []/' "$conf"
        elif grep -qs '^\[containers\]' "$conf"; then
            sed -i '/^\[containers\]/a default_ulimits = []' "$conf"
        else
            printf '[containers]\ndefault_ulimits = []\n' >>"$conf"
        fi
        echo "engine.sh: set default_ulimits = [] in $conf (hard nofile limit $(ulimit -Hn))" >&2
    fi
}

serve_podman() {
    if ! serving; then
        mkdir -p "$(dirname "$sock")"
        setsid podman system service --time=0 "unix://$sock" >/run/podman/otel-gil-service.log 2>&1 </dev/null &
        echo $! >"$pidfile"
        for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
        [ -S "$sock" ] || { echo "engine.sh: podman system service did not start: see /run/podman/otel-gil-service.log" >&2; exit 1; }
    fi
    command -v docker-compose >/dev/null || { echo "engine.sh: docker-compose is missing: run scripts/setup-host.sh" >&2; exit 1; }
    printf 'engine=podman\ndocker_host=unix://%s\ncompose=docker-compose\n' "$sock"
}

case ${1:-} in
    name)
        if docker_answers; then echo docker; else setup_podman; echo podman; fi ;;
    up)
        if docker_answers; then
            compose="docker compose"
            docker compose version >/dev/null 2>&1 || compose=docker-compose
            printf 'engine=docker\ndocker_host=\ncompose=%s\n' "$compose"
        else
            setup_podman
            serve_podman
        fi ;;
    down)
        if serving; then
            kill "$(cat "$pidfile")"
            rm -f "$pidfile" "$sock"
        fi ;;
    *) echo "usage: $0 name|up|down" >&2; exit 2 ;;
esac

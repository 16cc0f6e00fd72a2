#!/usr/bin/env bash
# Prometheus' promtool (built once by scripts/prometheus.sh from the server's Go module).
#   scripts/promtool.sh check rules FILE...   (any promtool arguments)
exec "$(dirname "$0")/prometheus.sh" promtool "$@"

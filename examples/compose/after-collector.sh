#!/bin/sh
# Entry point of the compose stack's apps: run the command once the collector's socket is there
# (it listens after compiling its BPF program), or after 60 s without it: otel-gil's default
# backend (auto) then traces in-process.
set -eu
for _ in $(seq 120); do
    [ -S "$OTEL_GIL_SOCKET" ] && break
    sleep 0.5
done
exec "$@"

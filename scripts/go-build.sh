#!/usr/bin/env bash
# `go build` as every build of ours from a Go module runs it (scripts/jaeger.sh, prometheus.sh,
# kube-bin.sh; images.sh's Collector Builder builds with the same -trimpath and CGO_ENABLED=0):
# static, paths trimmed, stripped. The same flags give a package at the same version the same
# action id in Go's one build cache (`go env GOCACHE`), so the packages these builds share compile
# once on a fresh machine (README "Tests": the cold path).
# Usage: scripts/go-build.sh [go build flags] PACKAGE...   in the module; more -ldflags in GO_LDFLAGS
set -euo pipefail
GOWORK=off GOFLAGS="-mod=mod -buildvcs=false" CGO_ENABLED=0 exec go build -trimpath -ldflags "-s -w ${GO_LDFLAGS:-}" "$@"

#!/usr/bin/env bash
# Builds the CNCF Distribution registry (github.com/distribution/distribution/v3/cmd/registry)
# from the Go module proxy into bin/registry/<version>/ (git-ignored), once per version. The
# private-registry e2e (test/e2e/registry_test.go) runs it on loopback with htpasswd
# credentials required, pushes the release image into it, and lets the kubelet pull that image
# by the release's imagePullSecrets. Cold: about 2 minutes on 2 cores. Prints the directory on
# stdout when done.
set -euo pipefail

REGISTRY_VERSION="${REGISTRY_VERSION:-v3.1.2}"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="$ROOT/bin/registry/$REGISTRY_VERSION"

mkdir -p "$OUT"
exec 9>"$OUT/.lock"
flock 9

if [ ! -x "$OUT/registry" ]; then
  start=$(date +%s)
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  # The module has no replace directives, so go install pkg@version builds it as released.
  CGO_ENABLED=0 GOBIN="$tmp" GOFLAGS=-buildvcs=false \
    go install -trimpath -ldflags "-s -w -X github.com/distribution/distribution/v3/version.version=$REGISTRY_VERSION" \
    "github.com/distribution/distribution/v3/cmd/registry@$REGISTRY_VERSION" >&2
  mv "$tmp/registry" "$OUT/registry"
  echo "built registry $REGISTRY_VERSION in $(( $(date +%s) - start ))s" >&2
fi
echo "$OUT"

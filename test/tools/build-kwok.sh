#!/usr/bin/env bash
# Builds kwok (Kubernetes WithOut Kubelet, sigs.k8s.io/kwok) from the Go module proxy into
# bin/kwok/<version>/ (git-ignored), once per version, and copies the module's stage
# definitions beside it. The scale run (test/scale) uses kwok to keep fake nodes alive and
# move bound pods through their lifecycle. Prints the directory holding the binary.
#
# Usage: test/tools/build-kwok.sh            prints the kwok directory on stdout when done
set -euo pipefail

KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="$ROOT/bin/kwok/$KWOK_VERSION"

mkdir -p "$OUT"
# Parallel test packages may ask at once; only one builds.
exec 9>"$OUT/.lock"
flock 9

if [ ! -x "$OUT/kwok" ]; then
  start=$(date +%s)
  CGO_ENABLED=0 GOBIN="$OUT" go install -trimpath "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" >&2
  echo "built kwok $KWOK_VERSION in $(( $(date +%s) - start ))s" >&2
fi
echo "$OUT"

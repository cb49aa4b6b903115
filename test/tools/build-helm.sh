#!/usr/bin/env bash
# Builds the helm CLI from the Go module proxy into bin/helm/<version>/ (git-ignored), once per
# version. Prints the binary's path.
set -euo pipefail
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="$ROOT/bin/helm/$HELM_VERSION"
mkdir -p "$OUT"
exec 9>"$OUT/.lock"
flock 9
if [ ! -x "$OUT/helm" ]; then
  GOBIN="$OUT" go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2
fi
echo "$OUT/helm"

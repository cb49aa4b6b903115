#!/usr/bin/env bash
# Builds the helm CLI from the Go module proxy into bin/helm/<version>/ (git-ignored), once per
# version. Prints the binary's path. HELM_VERSION picks it: Helm 3 drives the tiers; the chart
# tests also render with Helm 4 (HELM_MAJOR=4).
set -euo pipefail
# HELM_MAJOR=4 picks the Helm 4 release the chart tests render with beside Helm 3.
case "${HELM_MAJOR:-3}" in
  3) HELM_VERSION="${HELM_VERSION:-v3.22.0}" ;;
  4) HELM_VERSION="${HELM_VERSION:-v4.3.2}" ;;
  *) echo "HELM_MAJOR=${HELM_MAJOR}: use 3 or 4" >&2; exit 2 ;;
esac
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="$ROOT/bin/helm/$HELM_VERSION"
mkdir -p "$OUT"
exec 9>"$OUT/.lock"
flock 9
if [ ! -x "$OUT/helm" ]; then
  # The module path carries the major version: helm.sh/helm/v3, helm.sh/helm/v4.
  major="${HELM_VERSION%%.*}"
  GOBIN="$OUT" go install -ldflags="-s -w" "helm.sh/helm/$major/cmd/helm@$HELM_VERSION" >&2
fi
echo "$OUT/helm"

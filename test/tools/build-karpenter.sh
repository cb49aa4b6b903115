#!/usr/bin/env bash
# Builds Karpenter's kwok provider (sigs.k8s.io/karpenter/kwok, a real Karpenter whose cloud
# provider makes kwok nodes) from the Go module proxy into bin/karpenter/<version>/ (git-ignored),
# once per version, and copies its CRDs beside it (crds/). The autoscaler tier (test/autoscale)
# runs it against the local apiserver. Karpenter v1.15 needs Go 1.26.9 or later; when the local
# toolchain is older, the Go command fetches GOTOOLCHAIN's from the module proxy (once, into the
# module cache). Cold: about 2 minutes on 2 cores. Prints the directory on stdout when done.
set -euo pipefail

KARPENTER_VERSION="${KARPENTER_VERSION:-v1.15.0}"
TOOLCHAIN="${KARPENTER_GOTOOLCHAIN:-go1.27.3}"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="$ROOT/bin/karpenter/$KARPENTER_VERSION"

mkdir -p "$OUT"
exec 9>"$OUT/.lock"
flock 9

if [ ! -x "$OUT/karpenter-kwok" ] || [ ! -f "$OUT/crds/karpenter.sh_nodeoverlays.yaml" ]; then
  start=$(date +%s)
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  # go install pkg@version refuses nothing here (the module has no replace directives); the
  # binary is named after its package directory, kwok, which would shadow kwok itself.
  GOTOOLCHAIN="$TOOLCHAIN" CGO_ENABLED=0 GOBIN="$tmp" GOFLAGS=-buildvcs=false \
    go install -trimpath "sigs.k8s.io/karpenter/kwok@$KARPENTER_VERSION" >&2
  mv "$tmp/kwok" "$OUT/karpenter-kwok"
  dir="$(GOTOOLCHAIN="$TOOLCHAIN" GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/karpenter@$KARPENTER_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
  mkdir -p "$OUT/crds"
  cp "$dir"/kwok/charts/crds/*.yaml "$dir"/kwok/apis/crds/*.yaml "$OUT/crds/"
  chmod -R u+w "$OUT/crds"
  echo "built karpenter $KARPENTER_VERSION (kwok provider) in $(( $(date +%s) - start ))s" >&2
fi
echo "$OUT"

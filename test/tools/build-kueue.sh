#!/usr/bin/env bash
# Builds Kueue's manager (sigs.k8s.io/kueue/cmd/kueue) from the Go module proxy into
# bin/kueue/<version>/ (git-ignored), once per version, with the CRDs, their conversion-webhook
# patches and the webhook configurations of that release beside it (crds/, crd-patches/,
# webhook.yaml). The ecosystem tier (test/ecosystem) runs it against the local apiserver, next
# to nvdomain's webhook. Cold: about 6 minutes on 2 cores. Prints the directory on stdout when done.
set -euo pipefail

KUEUE_VERSION="${KUEUE_VERSION:-v0.17.1}"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="$ROOT/bin/kueue/$KUEUE_VERSION"

mkdir -p "$OUT"
exec 9>"$OUT/.lock"
flock 9

if [ ! -x "$OUT/kueue" ] || [ ! -f "$OUT/webhook.yaml" ] || [ ! -d "$OUT/crd-patches" ]; then
  start=$(date +%s)
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  # The module has no replace directives, so go install pkg@version builds it as released.
  CGO_ENABLED=0 GOBIN="$tmp" GOFLAGS=-buildvcs=false \
    go install -trimpath -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION" \
    "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION" >&2
  mv "$tmp/kueue" "$OUT/kueue"
  dir="$(GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
  rm -rf "$OUT/crds"
  mkdir -p "$OUT/crds"
  cp "$dir"/config/components/crd/bases/*.yaml "$OUT/crds/"
  cp "$dir"/config/components/webhook/manifests.yaml "$OUT/webhook.yaml"
  # The conversion-webhook patches name the CRDs Kueue's certificate rotator injects its CA into.
  rm -rf "$OUT/crd-patches"
  mkdir -p "$OUT/crd-patches"
  cp "$dir"/config/components/crd/patches/webhook_in_*.yaml "$OUT/crd-patches/"
  chmod -R u+w "$OUT/crds" "$OUT/crd-patches" "$OUT/webhook.yaml"
  echo "built kueue $KUEUE_VERSION in $(( $(date +%s) - start ))s" >&2
fi
echo "$OUT"

#!/usr/bin/env bash
# Builds LeaderWorkerSet's controller manager (sigs.k8s.io/lws/cmd) from the Go module proxy
# into bin/lws/<version>/ (git-ignored), once per version, with the release's CRDs, webhook
# configurations and their kustomize patches beside it (crds/, webhook.yaml, patches/). The
# LeaderWorkerSet tier (test/lws) runs it against the local apiserver, next to nvdomain's
# webhook. Cold: about 4 minutes on 2 cores. Prints the directory on stdout when done.
set -euo pipefail

LWS_VERSION="${LWS_VERSION:-v0.8.0}"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="$ROOT/bin/lws/$LWS_VERSION"

mkdir -p "$OUT"
exec 9>"$OUT/.lock"
flock 9

if [ ! -x "$OUT/lws" ] || [ ! -f "$OUT/webhook.yaml" ] || [ ! -d "$OUT/patches" ]; then
  start=$(date +%s)
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  # go install pkg@version would ask the module proxy for the list of lws's versions (for its
  # deprecation notice), which the proxy refuses for this module; a wrapper module that
  # requires the release, with the release's own requirements, builds the same binary.
  dir="$(GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/lws@$LWS_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
  sed -e 's#^module .*#module lwsbuild#' "$dir/go.mod" > "$tmp/go.mod"
  printf 'require sigs.k8s.io/lws %s\n' "$LWS_VERSION" >> "$tmp/go.mod"
  cp "$dir/go.sum" "$tmp/go.sum"
  (cd "$tmp" && CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false" go build -trimpath -ldflags "-s -w" -o "$tmp/lws" sigs.k8s.io/lws/cmd >&2)
  mv "$tmp/lws" "$OUT/lws"
  rm -rf "$OUT/crds" "$OUT/patches"
  mkdir -p "$OUT/crds" "$OUT/patches"
  cp "$dir"/config/crd/bases/*.yaml "$OUT/crds/"
  cp "$dir"/config/webhook/manifests.yaml "$OUT/webhook.yaml"
  cp "$dir"/config/webhook/*-patch.yaml "$dir"/config/crd/patches/*.yaml "$OUT/patches/" 2>/dev/null || true
  chmod -R u+w "$OUT/crds" "$OUT/patches" "$OUT/webhook.yaml"
  echo "built lws $LWS_VERSION in $(( $(date +%s) - start ))s" >&2
fi
echo "$OUT"

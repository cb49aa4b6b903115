#!/usr/bin/env bash
# Builds containerd (with ctr and the runc shim) and crictl from the Go module proxy into
# bin/containerd/<containerd version>/ (git-ignored), once per version. runc and busybox come
# from Debian packages (.ci/run installs them).
#
# Usage: test/tools/build-containerd.sh     prints the binary directory on stdout when done
set -euo pipefail

CONTAINERD_VERSION="${CONTAINERD_VERSION:-v2.4.2}"
CRICTL_VERSION="${CRICTL_VERSION:-v1.34.0}"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="$ROOT/bin/containerd/$CONTAINERD_VERSION"
mkdir -p "$OUT"
exec 9>"$OUT/.lock"
flock 9

want=(containerd ctr containerd-shim-runc-v2 crictl)
have_all() { for b in "${want[@]}"; do [ -x "$OUT/$b" ] || return 1; done; }
if have_all; then echo "$OUT"; exit 0; fi

start=$(date +%s)
export GOBIN="$OUT"
# One go install for containerd's three commands, so their links run side by side; -s -w
# leaves out the symbol table and DWARF, a large share of each link, which nothing here reads.
pkgs=()
for cmd in containerd ctr containerd-shim-runc-v2; do
  [ -x "$OUT/$cmd" ] || pkgs+=("github.com/containerd/containerd/v2/cmd/$cmd@$CONTAINERD_VERSION")
done
[ ${#pkgs[@]} -eq 0 ] || go install -trimpath -ldflags "-s -w" "${pkgs[@]}" >&2
[ -x "$OUT/crictl" ] || go install -trimpath -ldflags "-s -w" "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION" >&2
echo "built containerd $CONTAINERD_VERSION and crictl $CRICTL_VERSION in $(( $(date +%s) - start ))s" >&2
echo "$OUT"

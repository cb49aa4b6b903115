#!/usr/bin/env bash
# Builds the real Kubernetes control plane, kubelet, kubectl and etcd from the Go module proxy
# into bin/k8s/<k8s version>/ (git-ignored), once per version. Integration tests and the demo
# use them through KUBEBUILDER_ASSETS.
#
# k8s.io/kubernetes cannot be `go install`ed: its go.mod replaces the staging modules with
# ./staging/src/... paths. A small wrapper module requires k8s.io/kubernetes and pins each
# staging module to the matching published v0.x version instead. etcd's server module has
# relative replaces too and gets the same treatment.
#
# Usage: test/tools/build-k8s.sh            prints the asset directory on stdout when done
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.37.2}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="$ROOT/bin/k8s/$K8S_VERSION"
SRC="$ROOT/bin/src"
BINARIES=(kube-apiserver kube-scheduler kube-controller-manager kubelet kubectl)

mkdir -p "$OUT" "$SRC"
# Parallel test packages may ask at once; only one builds.
exec 9>"$OUT/.lock"
flock 9

have_all() {
  for b in "${BINARIES[@]}" etcd; do [ -x "$OUT/$b" ] || return 1; done
}
if have_all; then
  echo "$OUT"
  exit 0
fi

export GOFLAGS=-mod=mod
minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
staging="v0.${K8S_VERSION#v1.}"

build_k8s() {
  local mod="$SRC/k8s-$K8S_VERSION"
  mkdir -p "$mod"
  local gomod
  gomod="$(cd "$mod" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
  {
    echo "module nvdomain.local/k8s-binaries"
    echo
    echo "go 1.26"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    for b in "${BINARIES[@]}"; do echo "tool k8s.io/kubernetes/cmd/$b"; done
    echo
    grep -E '^\s*k8s.io/[^ ]+ => ./staging/src/' "$gomod" | awk -v v="$staging" '{print "replace " $1 " => " $1 " " v}'
  } >"$mod/go.mod"
  (cd "$mod" && go mod tidy >/dev/null)
  # -s -w: no symbol table or DWARF, which the tiers never read (profiles are symbolized from
  # the runtime's own tables); the linker's DWARF pass is a large share of each binary's link.
  local ldf="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldf+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  done
  local pkgs=()
  for b in "${BINARIES[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
  (cd "$mod" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldf" -o "$OUT/" "${pkgs[@]}")
}

build_etcd() {
  local mod="$SRC/etcd-$ETCD_VERSION"
  mkdir -p "$mod"
  cat >"$mod/go.mod" <<GOMOD
module nvdomain.local/etcd-binary

go 1.26

require go.etcd.io/etcd/server/v3 $ETCD_VERSION

tool go.etcd.io/etcd/server/v3

replace (
	go.etcd.io/etcd/api/v3 => go.etcd.io/etcd/api/v3 $ETCD_VERSION
	go.etcd.io/etcd/client/pkg/v3 => go.etcd.io/etcd/client/pkg/v3 $ETCD_VERSION
	go.etcd.io/etcd/client/v3 => go.etcd.io/etcd/client/v3 $ETCD_VERSION
	go.etcd.io/etcd/pkg/v3 => go.etcd.io/etcd/pkg/v3 $ETCD_VERSION
)
GOMOD
  (cd "$mod" && go mod tidy >/dev/null && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$OUT/etcd" go.etcd.io/etcd/server/v3)
}

start=$(date +%s)
if [ ! -x "$OUT/etcd" ]; then
  build_etcd >&2
  echo "built etcd $ETCD_VERSION in $(( $(date +%s) - start ))s" >&2
fi
k8s_start=$(date +%s)
for b in "${BINARIES[@]}"; do
  if [ ! -x "$OUT/$b" ]; then
    build_k8s >&2
    echo "built Kubernetes $K8S_VERSION in $(( $(date +%s) - k8s_start ))s" >&2
    break
  fi
done
echo "$OUT"

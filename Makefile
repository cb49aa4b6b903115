# nvdomain build, test and lint entry points. `make test` is what CI runs (.ci/run).
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c

GO          ?= go
BIN         := $(CURDIR)/bin
TOOLS       := $(BIN)/tools
STATICCHECK_VERSION := v0.8.2
K8S_VERSION ?= v1.37.2
K8S_ASSETS  := $(BIN)/k8s/$(K8S_VERSION)
STATICCHECK := $(TOOLS)/staticcheck-$(STATICCHECK_VERSION)
FUZZTIME    ?= 30s
VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS     := -X github.com/nvdomain/nvdomain/pkg/version.Version=$(VERSION)
# The chart's version is semver: the tag without its v, or 0.0.0-<describe> between tags.
CHART_VERSION ?= $(shell v='$(VERSION)'; v=$${v#v}; if echo "$$v" | grep -Eq '^[0-9]+\.[0-9]+\.[0-9]+([-+].*)?$$'; then echo "$$v"; else echo "0.0.0-$$v"; fi)
CHART_OUT   ?= $(BIN)/chart
IMAGE_REPO  ?= ghcr.io/nvdomain/nvdomain
IMAGE_TAG   ?= $(VERSION)
IMAGE       := $(IMAGE_REPO):$(IMAGE_TAG)
IMAGE_ARCHIVE := $(BIN)/image/nvdomain-$(IMAGE_TAG).tar
# The release image's platforms: Grace nodes (GB200, GB300, GH200) are arm64. arm64's cgo
# binaries are cross-built with Debian's gcc-aarch64-linux-gnu (cross-deps installs it).
PLATFORMS   ?= linux/amd64,linux/arm64
HOST_PLATFORM := linux/$(shell $(GO) env GOARCH 2>/dev/null || echo amd64)
# The other architecture's cross toolchain (Debian names it by the build machine's) and the
# qemu-user binary that runs its programs in pkg/image's test.
ifeq ($(HOST_PLATFORM),linux/arm64)
CROSS_CC := x86_64-linux-gnu-gcc
CROSS_PKGS := gcc-x86-64-linux-gnu libc6-dev-amd64-cross
CROSS_QEMU := qemu-x86_64-static
else
CROSS_CC := aarch64-linux-gnu-gcc
CROSS_PKGS := gcc-aarch64-linux-gnu libc6-dev-arm64-cross
CROSS_QEMU := qemu-aarch64-static
endif
# The image's binaries are built with these tags (pkg/image.BuildTags); the demo's own binary
# uses them too, with -trimpath, so it reuses the packages the image build compiled.
IMAGE_BUILD_TAGS := netgo,osusergo
# The demo and the e2e install exactly the image `make image` built (test/localcluster).
IMAGE_ENV   := NVDOMAIN_IMAGE=$(IMAGE) NVDOMAIN_IMAGE_ARCHIVE=$(IMAGE_ARCHIVE)

# go-nvml loads libnvidia-ml with cgo; its generated bindings call functions the NVML header
# marks deprecated, which only adds compiler noise.
export CGO_CFLAGS ?= -O2 -g -Wno-deprecated-declarations

.PHONY: all build image chart test unit e2e matrix host-deps k8s-assets containerd-assets helm-assets kwok-assets karpenter-assets kueue-assets lws-assets registry-assets cross-deps demo-assets demo-helm demo-image lint fmt vet staticcheck cover fuzz bench bench-placement bench-admission bench-dra bench-dra-blocks bench-dra-upstream bench-dra-huge bench-placement-huge scale demo down clean

all: build

build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/...

## image: the release image, without a Docker engine (pkg/image), for PLATFORMS (default
## linux/amd64 and linux/arm64, one image index): an OCI layout in bin/image/<tag>/ (`crane
## push`, `skopeo copy --all oci:`) and this machine's platform as an archive
## bin/image/nvdomain-<tag>.tar for `ctr -n k8s.io images import` or `docker load`; the same
## commit gives the same digests. IMAGE_REPO and IMAGE_TAG name it (default
## ghcr.io/nvdomain/nvdomain:<git describe>). arm64 needs Debian's gcc-aarch64-linux-gnu and
## libc6-dev-arm64-cross (make cross-deps).
image:
	SOURCE_DATE_EPOCH=$$(git log -1 --format=%ct 2>/dev/null || echo 0) $(GO) run ./cmd/nvdomain-image \
		--version $(VERSION) --revision $$(git rev-parse HEAD 2>/dev/null || echo unknown) --ref $(IMAGE) --out $(BIN)/image --platforms $(PLATFORMS)

## chart: the Helm chart packaged with the release: appVersion is $(VERSION) (the git tag,
## the image tag `make image` gives, and the ref of the runbook links); the chart version is
## its semver. Writes $(CHART_OUT)/nvdomain-<version>.tgz.
chart: helm-assets
	@mkdir -p $(CHART_OUT)
	$$(test/tools/build-helm.sh) package charts/nvdomain --version $(CHART_VERSION) --app-version $(VERSION) -d $(CHART_OUT)

## test: everything CI checks: lint, unit and integration tests with the race detector, then
## the end-to-end run on a real local cluster.
test: lint unit e2e

# Integration tests (test/) run the real kube-apiserver, etcd and kube-scheduler, built from the
# Go module proxy once per version into bin/k8s/<version> (about 6 minutes cold, free warm).
k8s-assets:
	K8S_VERSION=$(K8S_VERSION) test/tools/build-k8s.sh >/dev/null

# Debian packages the real-component tiers need: runc, a static busybox for the test images,
# and iproute2 and util-linux (ip, unshare) for the private network namespace the cluster tiers
# run in (test/netns).
host-deps:
	@if ! command -v runc >/dev/null || ! command -v ip >/dev/null || ! command -v unshare >/dev/null || \
		! { ldd /bin/busybox 2>&1 || true; } | grep -q "not a dynamic executable"; then \
		echo "installing runc, busybox-static, iproute2 and util-linux"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends runc busybox-static iproute2 util-linux; \
	fi

# For the other half of the two-platform release image: the cross C toolchain its cgo binaries
# are built with, and qemu-user, which runs them in pkg/image's test. The demo and the e2e
# build this machine's platform only, and skip it.
cross-deps: host-deps
	@if ! command -v $(CROSS_CC) >/dev/null || ! dpkg -s $(lastword $(CROSS_PKGS)) >/dev/null 2>&1 || ! command -v $(CROSS_QEMU) >/dev/null; then \
		echo "installing the cross toolchain and qemu-user for the release image's other platform"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(CROSS_PKGS) qemu-user-static; \
	fi

# The NRI tier (test/containerd) runs a real containerd v2 with NRI, built the same way into
# bin/containerd/<version> (about 2 minutes cold), with Debian's runc and busybox-static.
containerd-assets:
	test/tools/build-containerd.sh >/dev/null

helm-assets:
	test/tools/build-helm.sh >/dev/null
	HELM_MAJOR=4 test/tools/build-helm.sh >/dev/null

# The scale run (test/scale) keeps its fake nodes with kwok, built the same way into
# bin/kwok/<version> (about a minute cold).
kwok-assets:
	test/tools/build-kwok.sh >/dev/null

# The autoscaler tier (test/autoscale) runs Karpenter's kwok provider, built the same way into
# bin/karpenter/<version> (about 2 minutes cold, with the Go 1.27 toolchain it needs fetched
# from the module proxy once).
karpenter-assets:
	test/tools/build-karpenter.sh >/dev/null

# The ecosystem tier (test/ecosystem) runs Kueue's and LeaderWorkerSet's managers, built the
# same way into bin/kueue/<version> and bin/lws/<version> with their CRDs and webhook
# configurations (about 6 and 3 minutes cold).
kueue-assets:
	test/tools/build-kueue.sh >/dev/null

lws-assets:
	test/tools/build-lws.sh >/dev/null

# The private-registry e2e's registry (CNCF Distribution), built from the module proxy.
registry-assets:
	test/tools/build-registry.sh >/dev/null

# The per-package limit is for a cold Go build cache: pkg/image's TestBuildContents cross-builds
# every binary of the release image for amd64 and arm64 while the other packages' tests share
# the 2 cores, which took 20 minutes on a fresh machine (a few warm).
unit: host-deps cross-deps k8s-assets containerd-assets helm-assets kwok-assets karpenter-assets kueue-assets lws-assets
	KUBEBUILDER_ASSETS=$(K8S_ASSETS) $(GO) test -race -count=1 -timeout 35m ./...

## e2e: the seed scenarios on a real single-node cluster (kubelet + containerd with NRI) with
## nvdomain installed by its Helm chart. Root only; runs alone.
## The whole log goes to bin/e2e.log; the console gets its last 80 lines and, when a test fails,
## every failure line with the steps just before it, which the tail alone would cut off (the
## e2e tests report failures only through t.Errorf/t.Fatalf, so `_test.go:N:` marks them).
e2e: host-deps k8s-assets containerd-assets helm-assets registry-assets
	@$(DEMO_SUBMAKE) image PLATFORMS=$(HOST_PLATFORM)
	@mkdir -p $(BIN); log=$(BIN)/e2e.log; rc=0; \
	$(IMAGE_ENV) $(GO) test -tags e2e -count=1 -timeout 30m -v ./test/e2e/ >$$log 2>&1 || rc=$$?; \
	tail -n 80 $$log; \
	if [ $$rc -ne 0 ]; then \
	  echo "=== e2e failed (exit $$rc); the failures, each with the 25 lines before it and 10 after (full log: $$log):"; \
	  grep -n -B25 -A10 -E '_test\.go:[0-9]+:|^panic:|^--- FAIL|test timed out' $$log | head -n 600 || true; \
	fi; \
	exit $$rc

lint: fmt vet staticcheck

fmt:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './bin/*')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet -tags e2e ./...

# staticcheck is built from the Go module proxy once per version and cached under bin/tools.
$(STATICCHECK):
	mkdir -p $(TOOLS)
	GOBIN=$(TOOLS) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	mv $(TOOLS)/staticcheck $@

staticcheck: $(STATICCHECK)
	$(STATICCHECK) -tags e2e ./...

cover: cross-deps
	$(GO) test -count=1 -cover ./pkg/...

## bench: every benchmark in one run (about 6 minutes): placement quality by simulation,
## admission latency at fixed rates against a no-op webhook, pod creation through a real
## kube-apiserver against a no-op webhook pair, the domain decision at scale, and the NRI
## plugin's cost; prints one table and writes docs/benchmarks.md with a plot. Root (the
## containerd and apiserver parts). It keeps the report's scale section, which `make scale`
## writes. Not part of `make test`, which runs smoke versions.
bench: host-deps k8s-assets containerd-assets
	$(GO) run ./test/bench

## bench-placement: only the placement simulation (some minutes: the 512-node runs take most); rewrites its
## section and summary rows of docs/benchmarks.md and the plot, and leaves the rest as it is.
bench-placement:
	$(GO) run ./test/bench -only placement

## bench-placement-huge: the placement simulation's DRA policies on the mixed cluster 78 times over
## (4,992 nodes, where kube-scheduler scores 549 of the feasible nodes), printed only.
bench-placement-huge:
	$(GO) run ./test/bench -only placement-huge

## bench-admission: only pod creation through a real kube-apiserver, nvdomain's webhook pair
## against a no-op pair registered the same way (a few minutes), then a CPU profile of one
## nvdomain replica under load, printed; rewrites only that part of docs/benchmarks.md. Root.
bench-admission: host-deps k8s-assets
	$(GO) run ./test/bench -only admission

## scale: 1,000 kwok nodes published by the agent, 5,000 TP pods created at 25/s and 4,000 at
## 50/s (the stress rate), each stream without the webhook and then with two replicas (about
## 12 minutes), with kube-scheduler profiled throughout (where its CPU goes, by plugin);
## prints the tables and rewrites the scale section and rows of docs/benchmarks.md; the raw
## profiles stay in bin/profiles/ (`go tool pprof -top bin/profiles/<file>`). Root. `make
## test` runs a 50-node smoke version (TestScaleSmoke).
scale: k8s-assets kwok-assets
	$(GO) run ./test/bench -only scale

## bench-dra: nvdomain's DRA mode against plain DRA (the cost peer: k devices, no constraint, no
## webhook) and classic mode on the same 500 kwok nodes: 2,000 TP pods at 50/s in each run,
## classic once, then plain and nvdomain twice each in ABBA order, with the floor (plain DRA's
## pods through nvdomain's webhooks, unchanged) between them (16-18 minutes); prints the
## table, each round, and the cost targets, and rewrites the "DRA against plain DRA and
## classic" section and rows of docs/benchmarks.md. Root. The fragmentation side is the
## placement simulation's (bench-placement). NVDOMAIN_WEBHOOK_PROFILES=<dir> also writes each
## webhook replica's CPU profile of every run there (profiling costs the replicas' side, which
## is nvdomain's: judge no target on such a run).
bench-dra: k8s-assets kwok-assets
	$(GO) run ./test/bench -only dra

## bench-dra-blocks: bench-dra with blocks (dra.blocks): the slices publish each domain's aligned
## blocks, the templates ask for one first, and the plain-DRA peer's class selects the GPUs
## alone. Needs Kubernetes 1.37 or later (kubernetes#138917). Prints its tables only (about 7
## minutes). Root.
bench-dra-blocks: k8s-assets kwok-assets
	NVDOMAIN_DRA_BLOCKS=1 $(GO) test -run '^$$' -bench '^BenchmarkDRA$$' -benchtime 1x -timeout 30m -v ./test/scale/

## bench-dra-upstream: scheduler_perf's SchedulingWithResourceClaimTemplate/5000pods_500nodes shape
## (kubernetes test/integration/scheduler_perf/dra/performance-config.yaml) under plain DRA and
## nvdomain's DRA mode on 500 kwok nodes: 2,000 one-GPU pods scheduled first, then 2,000 measured,
## the cluster full at the end; prints both beside upstream's published bands (about 8 minutes).
## Root.
bench-dra-upstream: k8s-assets kwok-assets
	$(GO) test -run '^$$' -bench '^BenchmarkDRAUpstream$$' -benchtime 1x -timeout 30m -v ./test/scale/

## bench-dra-huge: bench-dra on 5,000 kwok nodes (3,000 with one 8-GPU domain, 2,000 with two
## 4-GPU domains), the same stream: where kube-scheduler samples 500 of the feasible nodes and
## the webhook's hint index holds every DRA node. Prints its tables only (about half an hour on 2
## cores). Root.
bench-dra-huge: k8s-assets kwok-assets
	NVDOMAIN_DRA_HUGE=1 $(GO) test -run '^$$' -bench '^BenchmarkDRA$$' -benchtime 1x -timeout 90m -v ./test/scale/

## matrix: the previous two Kubernetes releases (MATRIX_VERSIONS), each built into
## bin/k8s/<version> like the default one: the unit and integration tests (envtest, the HA
## control plane, DRA, Kueue/LWS and Karpenter tiers) against that release's apiserver,
## scheduler and controller-manager, and the chart rendered for it (--kube-version). About 15
## minutes a release warm, 12 more cold. Not part of `make test`; CI can run it.
MATRIX_VERSIONS ?= v1.36.3 v1.35.4
matrix: host-deps cross-deps containerd-assets helm-assets kwok-assets karpenter-assets kueue-assets lws-assets
	@for v in $(MATRIX_VERSIONS); do \
	  echo "=== Kubernetes $$v"; \
	  K8S_VERSION=$$v test/tools/build-k8s.sh >/dev/null; \
	  KUBEBUILDER_ASSETS=$(BIN)/k8s/$$v NVDOMAIN_KUBE_VERSION=$$v $(GO) test -race -count=1 -timeout 20m ./... || exit 1; \
	done

## fuzz: run every fuzz target for FUZZTIME each (not part of `make test`).
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) ./pkg/topology/topomatrix/
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) ./pkg/topology/simulated/
	$(GO) test -run '^$$' -fuzz '^FuzzHandlers$$' -fuzztime $(FUZZTIME) ./webhook/

## demo: a real single-node cluster, nvdomain installed with its Helm chart (simulated
## topology), the seed scenarios applied from manifests/examples, and a report. Root only.
## The terminal gets one line per phase, then the report; apt, build and scenario output go to
## the log named at the end. KEEP=1 leaves the cluster up and prints how to reach it. MODE=dra
## installs nvdomain as the node's DRA driver and runs the DRA-mode scenarios (docs/dra.md).
# The recipe calls make through an alias: a line naming $(MAKE) itself runs even under
# `make -n`, which would start a cluster.
DEMO_SUBMAKE = $(MAKE) --no-print-directory
# What the demo runs, and no more: this machine's platform of the image, Helm 3 alone (the chart
# tests add Helm 4), no cross toolchain. Built side by side (make -j): one go build leaves a
# core idle for long stretches (a package whose dependents all wait for it, a link).
demo-assets: k8s-assets containerd-assets demo-helm demo-image
demo-helm:
	test/tools/build-helm.sh >/dev/null
demo-image:
	@$(DEMO_SUBMAKE) image PLATFORMS=$(HOST_PLATFORM)
demo:
	@log=$$(mktemp /tmp/nvdomain-demo-XXXXXX.log); bindir=$$(mktemp -d); start=$$(date +%s); rc=0; \
	printf '%-22s … ' 'building binaries'; \
	if ! { $(DEMO_SUBMAKE) host-deps && $(DEMO_SUBMAKE) -j4 --output-sync=target demo-assets && \
		$(GO) build -trimpath -tags $(IMAGE_BUILD_TAGS) -o $$bindir/demo ./test/demo; } >>$$log 2>&1; then \
		echo "failed; the end of $$log:"; tail -n 20 $$log; rm -rf $$bindir; exit 1; \
	fi; \
	echo "$$(( $$(date +%s) - start ))s"; \
	$(IMAGE_ENV) NVDOMAIN_DEMO_LOG=$$log $$bindir/demo || rc=$$?; rm -rf $$bindir; exit $$rc

## down: stop the cluster `KEEP=1 make demo` left running and clean up after it, as the demo's
## own teardown would (processes, mounts, cgroups, kernel settings).
down:
	@$(GO) run ./test/demo -down

clean:
	rm -rf $(BIN)

package webhook

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/go-logr/logr"

	decision "github.com/nvdomain/nvdomain/pkg/admission"
	"github.com/nvdomain/nvdomain/pkg/rules"
	"github.com/nvdomain/nvdomain/pkg/topology/simulated"
)

const poolsDoc = `{"pools":[
 {"name":"hgx","nodeSelector":{"karpenter.sh/nodepool":"hgx"},"gpuCount":8,"domains":[{"gpus":[0,1,2,3,4,5,6,7]}]},
 {"name":"split","nodeSelector":{"karpenter.sh/nodepool":"split"},"labels":{"kubernetes.io/os":"linux","nvidia.com/gpu.present":"true"},"gpuCount":8,"domains":[{"gpus":[0,1,2,3]},{"gpus":[4,5,6,7]}]}]}`

func poolsConfigMap(data string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "nvdomain-system", Name: "nvdomain-pools"}, Data: map[string]string{simulated.ConfigMapKey: data}}
}

func newPoolsFixture(t *testing.T, nodes ...*corev1.Node) (*fixture, *poolsFeed) {
	t.Helper()
	f := newFixture(t, decision.NonTPAuto, nodes...)
	pf := newTestFeed(t, f)
	pf.apply(poolsConfigMap(poolsDoc))
	return f, pf
}

// A cluster with no GPU node at all admits a TP pod that a declared pool fits, pins it to a
// domain id that pool offers and warns that it waits for the pool; a pod no pool fits is
// still rejected, naming the nodes and the pools.
func TestPodsWaitForADeclaredPool(t *testing.T) {
	cases := []struct {
		name     string
		pod      func() *corev1.Pod
		nodes    []*corev1.Node
		domain   int
		warning  string // a substring of the one warning; "" for none
		rejected string
	}{
		{"TP=8 with no node waits for hgx", func() *corev1.Pod { return pod(true, 8) }, nil, 0,
			"no node offers this now: no node it may run on has NVSwitch domain 0 with 8 GPUs; waiting for pool hgx to scale up", ""},
		{"TP=4 with no node waits for a pool", func() *corev1.Pod { return pod(true, 4) }, nil, -1,
			"to scale up (its autoscaler must know that a new node offers nvidia.com/nvswitch-domain-", ""},
		{"a pod selecting the split pool waits for it", func() *corev1.Pod {
			p := pod(true, 4)
			p.Spec.NodeSelector = map[string]string{"karpenter.sh/nodepool": "split"}
			return p
		}, nil, -1, "waiting for pool split to scale up", ""},
		{"a pod selecting labels only a pool declares (not its nodeSelector) waits for it", func() *corev1.Pod {
			p := pod(true, 4)
			p.Spec.NodeSelector = map[string]string{"kubernetes.io/os": "linux", "nvidia.com/gpu.present": "true"}
			return p
		}, nil, -1, "waiting for pool split to scale up", ""},
		{"a node with room wins: no warning", func() *corev1.Pod { return pod(true, 4) }, []*corev1.Node{seedNode()}, -1, "", ""},
		{"TP=8 next to a small node waits for hgx", func() *corev1.Pod { return pod(true, 8) }, []*corev1.Node{seedNode()}, 0,
			"waiting for pool hgx to scale up", ""},
		{"TP=16 fits no node and no pool", func() *corev1.Pod { return pod(true, 16) }, []*corev1.Node{seedNode()}, -1, "",
			"spec.containers[0].resources.limits[nvidia.com/gpu]: tensor-parallel size 16 cannot run: no node has an NVSwitch domain of 16 GPUs; largest is 4 on node gpu-node01; nor will a declared pool: the largest domain a pool this pod can run on offers is 8, in hgx; lower the tensor-parallel size, or add nodes with larger NVLink domains"},
		{"a selector no pool matches", func() *corev1.Pod {
			p := pod(true, 4)
			p.Spec.NodeSelector = map[string]string{"karpenter.sh/nodepool": "other"}
			return p
		}, nil, -1, "",
			"spec.containers[0].resources.limits[nvidia.com/gpu]: tensor-parallel size 4 cannot run: no node this pod can run on has an NVSwitch domain; a tensor-parallel pod of 4 GPUs needs 4 GPUs joined by NVLink on one node; no declared pool this pod can run on has one either (declared: hgx, split; check the pod's node selector against the pools' nodeSelector, and its tolerations against their taints); lower the tensor-parallel size, or add nodes with larger NVLink domains"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, _ := newPoolsFixture(t, tc.nodes...)
			out, mresp, vresp := f.admit(t, tc.pod())
			if tc.rejected != "" {
				if vresp.Allowed || vresp.Result.Message != tc.rejected {
					t.Fatalf("validate = allowed %v\n got %q\nwant %q", vresp.Allowed, vresp.Result.Message, tc.rejected)
				}
				return
			}
			if !mresp.Allowed || !vresp.Allowed {
				t.Fatalf("mutate %v validate %v: %s", mresp.Allowed, vresp.Allowed, vresp.Result.Message)
			}
			p := rules.Inspect(out, n)
			if p.PinnedDomain() < 0 || (tc.domain >= 0 && p.PinnedDomain() != tc.domain) {
				t.Fatalf("pinned to %d, want %d", p.PinnedDomain(), tc.domain)
			}
			warnings := append(mresp.Warnings, vresp.Warnings...)
			if tc.warning == "" {
				if len(warnings) != 0 {
					t.Fatalf("warnings %q, want none", warnings)
				}
				return
			}
			if len(warnings) != 1 || !strings.Contains(warnings[0], tc.warning) {
				t.Fatalf("warnings %q, want one containing %q", warnings, tc.warning)
			}
			if got := testutil.ToFloat64(f.m.Warnings.WithLabelValues("waiting-for-pool")); got != 1 {
				t.Errorf("waiting-for-pool warnings metric = %v", got)
			}
		})
	}
}

func newTestFeed(t *testing.T, f *fixture) *poolsFeed {
	t.Helper()
	m, err := NewPoolMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	pf, err := newPoolsFeed(PoolsConfigMap{Namespace: "nvdomain-system", Name: "nvdomain-pools"}, f.view, n, m, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	return pf
}

// A replica whose ConfigMap, there at its start, does not parse is not ready; once one version
// parsed, a bad edit keeps it and the replica stays ready. A ConfigMap absent at the start and
// created broken later leaves every replica ready, with no pools: not all of them unready at
// once.
func TestPoolsFeedReadiness(t *testing.T) {
	const broken = `{"pools":[{"name":"hgx","gpuCount":8,"domains":[{"gpus":[0,9]}]}]}`
	f := newFixture(t, decision.NonTPAuto)
	pf := newTestFeed(t, f)
	sum := sha256.Sum256([]byte(broken))
	pf.cm.Checksum = hex.EncodeToString(sum[:]) // the release wrote this broken version
	synced := false
	pf.synced = func() bool { return synced }
	if err := pf.Ready(); err != nil {
		t.Fatalf("no ConfigMap yet: %v", err)
	}
	pf.apply(poolsConfigMap(broken)) // during the first list
	synced = true
	if err := pf.Ready(); err == nil || !strings.Contains(err.Error(), "does not parse, and this replica has no earlier version") {
		t.Fatalf("a first version that does not parse: %v", err)
	}
	pf.apply(poolsConfigMap(poolsDoc))
	if err := pf.Ready(); err != nil {
		t.Fatalf("after a good version: %v", err)
	}
	pf.apply(poolsConfigMap(`not json`))
	if err := pf.Ready(); err != nil || len(f.view.Pools()) != 2 {
		t.Fatalf("a bad edit after a good version: %v, %d pools", err, len(f.view.Pools()))
	}

	late := newTestFeed(t, newFixture(t, decision.NonTPAuto))
	late.cm.Checksum = pf.cm.Checksum
	late.synced = func() bool { return true } // the first list found no ConfigMap
	late.apply(poolsConfigMap(broken))
	if err := late.Ready(); err != nil {
		t.Fatalf("a ConfigMap created broken after the start: %v", err)
	}

	// A replica restarted after a hand edit broke the ConfigMap: not the release's version,
	// so it serves without pools rather than going unready with every other replica.
	byHand := newTestFeed(t, newFixture(t, decision.NonTPAuto))
	byHand.cm.Checksum = "0000"
	byHand.synced = func() bool { return false }
	byHand.apply(poolsConfigMap(broken))
	byHand.synced = func() bool { return true }
	if err := byHand.Ready(); err != nil || len(byHand.view.Pools()) != 0 {
		t.Fatalf("started on a hand-broken ConfigMap: %v", err)
	}
}

// A bad edit keeps the pools of the last good version; a deleted ConfigMap declares none.
func TestPoolsFeedKeepsTheLastGoodVersion(t *testing.T) {
	f, pf := newPoolsFixture(t)
	if got := len(f.view.Pools()); got != 2 {
		t.Fatalf("pools = %d", got)
	}
	pf.apply(poolsConfigMap(`{"pools":[{"name":"hgx","gpuCount":8}]}`))
	if got := len(f.view.Pools()); got != 2 || testutil.ToFloat64(pf.Valid) != 0 {
		t.Fatalf("after a bad edit: pools = %d, valid = %v", got, testutil.ToFloat64(pf.Valid))
	}
	pf.apply(poolsConfigMap(`{"pools":[{"name":"hgx","nodeSelector":{"pool":"hgx"},"gpuCount":8,"domains":[{"gpus":[0,1,2,3,4,5,6,7]}]}]}`))
	if got := len(f.view.Pools()); got != 1 || testutil.ToFloat64(pf.Valid) != 1 || testutil.ToFloat64(pf.Count) != 1 {
		t.Fatalf("after a good edit: pools = %d", got)
	}
	pf.apply(nil)
	if got := len(f.view.Pools()); got != 0 {
		t.Fatalf("after delete: pools = %d", got)
	}
	_, _, v := f.admit(t, pod(true, 4))
	if v.Allowed {
		t.Fatal("with no pool and no node a TP pod must be rejected")
	}
}

func TestParsePoolsConfigMap(t *testing.T) {
	for _, bad := range []string{"nvdomain-pools", "/x", "ns/", "a/b/c"} {
		if _, err := ParsePoolsConfigMap(bad); err == nil || !strings.Contains(err.Error(), "namespace/name") {
			t.Errorf("%q: err = %v", bad, err)
		}
	}
	if got, err := ParsePoolsConfigMap("ns/name"); err != nil || got != (PoolsConfigMap{Namespace: "ns", Name: "name"}) {
		t.Errorf("ns/name = %+v, %v", got, err)
	}
}

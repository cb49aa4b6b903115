package webhook

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nvdomain/nvdomain/pkg/clusterview"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/topology/simulated"
)

// PoolsConfigMap names the ConfigMap that declares the GPU pools (docs/pools.md): a
// simulated-topology document whose "pools" the webhook counts as capacity an autoscaler adds.
// Checksum, when set, is the SHA-256 (hex) of the topology.json the release wrote there.
type PoolsConfigMap struct{ Namespace, Name, Checksum string }

// ParsePoolsConfigMap reads namespace/name; empty means no pools.
func ParsePoolsConfigMap(s string) (PoolsConfigMap, error) {
	if s == "" {
		return PoolsConfigMap{}, nil
	}
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return PoolsConfigMap{}, fmt.Errorf("%q: give namespace/name, e.g. nvdomain-system/nvdomain-pools", s)
	}
	return PoolsConfigMap{Namespace: ns, Name: name}, nil
}

// WatchPools adds to byObject the informer on the pools ConfigMap alone: its namespace, and a
// field selector on its name, which is what lets the chart's Role name that one ConfigMap
// (the apiserver authorizes a list or watch with a metadata.name selector as a request for
// that name).
func (p PoolsConfigMap) WatchPools(byObject map[client.Object]cache.ByObject) {
	if p.Name == "" {
		return
	}
	byObject[&corev1.ConfigMap{}] = cache.ByObject{Namespaces: map[string]cache.Config{
		p.Namespace: {FieldSelector: fields.OneTermEqualSelector("metadata.name", p.Name)},
	}}
}

// poolsFeed keeps the view's pools equal to the ConfigMap's. A document that fails to parse
// leaves the pools the last good one declared (a typo in an edit must not turn every
// waiting pod's pool into an impossible request) and is reported in the log and in
// nvdomain_webhook_pools_valid; a deleted ConfigMap declares no pools. A replica that starts
// on a ConfigMap that does not parse is not ready (Ready).
type poolsFeed struct {
	cm     PoolsConfigMap
	view   *clusterview.View
	names  names.Names
	parser *simulated.Parser
	log    logr.Logger
	PoolMetrics

	mu sync.Mutex
	// good: this process has a good version to keep: one parsed, or none at all because the
	// ConfigMap was absent when the informer synced or was deleted since; bad: the latest
	// version did not parse. synced says whether the informer's first list is done.
	good, bad bool
	lastErr   error
	synced    func() bool
	// lastSum is the SHA-256 of the latest version's topology.json.
	lastSum string
}

// PoolMetrics are the pools feed's gauges.
type PoolMetrics struct {
	// Valid is 1 while the pools ConfigMap parses (or is absent), 0 while the replica keeps
	// the pools of an earlier version (or, having none, is not ready).
	Valid prometheus.Gauge
	// Count is the pools the replica counts.
	Count prometheus.Gauge
}

// NewPoolMetrics registers the pools feed's gauges.
func NewPoolMetrics(reg prometheus.Registerer) (PoolMetrics, error) {
	m := PoolMetrics{
		Valid: prometheus.NewGauge(prometheus.GaugeOpts{Name: "nvdomain_webhook_pools_valid",
			Help: "1 while the pools ConfigMap parses (or is absent), 0 while the webhook keeps the pools of its last good version."}),
		Count: prometheus.NewGauge(prometheus.GaugeOpts{Name: "nvdomain_webhook_pools",
			Help: "GPU pools the webhook counts as capacity an autoscaler adds (docs/pools.md)."}),
	}
	for _, c := range []prometheus.Collector{m.Valid, m.Count} {
		if err := reg.Register(c); err != nil {
			return PoolMetrics{}, fmt.Errorf("register pool metrics: %w", err)
		}
	}
	m.Valid.Set(1)
	return m, nil
}

// Ready fails while this process has no good version to keep (the ConfigMap existed when the
// informer synced and no version of it has parsed since) and the broken version is the one its
// release wrote (PoolsConfigMap.Checksum): a broken upgrade then stops its rollout at the first
// replica. A ConfigMap broken by hand, or created broken later, leaves the replica ready with
// the pools it had (none, or the last good ones): otherwise every replica restarted after the
// edit would go unready, and TP pods could not be created at all.
func (f *poolsFeed) Ready() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.promoteLocked()
	if f.bad && !f.good && f.cm.Checksum != "" && f.lastSum == f.cm.Checksum {
		return fmt.Errorf("the pools ConfigMap %s/%s does not parse, and this replica has no earlier version to keep: %v", f.cm.Namespace, f.cm.Name, f.lastErr)
	}
	return nil
}

// promoteLocked records that the ConfigMap was absent at the informer's first list: synced,
// and nothing applied during it (the first list's events run before the registration reports
// synced).
func (f *poolsFeed) promoteLocked() {
	if !f.good && !f.bad && f.synced != nil && f.synced() {
		f.good = true
	}
}

func (f *poolsFeed) outcome(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.promoteLocked()
	f.bad, f.lastErr = err != nil, err
	if err == nil {
		f.good = true
	}
}

func newPoolsFeed(cm PoolsConfigMap, view *clusterview.View, n names.Names, m PoolMetrics, log logr.Logger) (*poolsFeed, error) {
	p, err := simulated.NewParser()
	if err != nil {
		return nil, err
	}
	return &poolsFeed{cm: cm, view: view, names: n, parser: p, log: log, PoolMetrics: m}, nil
}

// apply sets the view's pools from the ConfigMap, nil when it is gone. A version that does
// not parse changes nothing but the gauge and the readiness (Ready).
func (f *poolsFeed) apply(cm *corev1.ConfigMap) {
	ref := f.cm.Namespace + "/" + f.cm.Name
	pools, err := clusterview.PoolsFromConfigMap(f.parser, cm, f.names)
	sum := ""
	if cm != nil {
		h := sha256.Sum256([]byte(cm.Data[simulated.ConfigMapKey]))
		sum = hex.EncodeToString(h[:])
	}
	f.mu.Lock()
	f.lastSum = sum
	f.mu.Unlock()
	f.outcome(err)
	if err != nil {
		f.Valid.Set(0)
		f.log.Error(err, "pools ConfigMap does not parse; keeping the pools declared before", "configMap", ref)
		return
	}
	f.view.SetPools(pools)
	f.Valid.Set(1)
	f.Count.Set(float64(len(pools)))
	f.log.Info("pools declared", "configMap", ref, "pools", len(pools), "deleted", cm == nil)
}

// feed registers the ConfigMap's handler on the cache.
func (f *poolsFeed) feed(c cache.Cache) (toolscache.ResourceEventHandlerRegistration, error) {
	inf, err := c.GetInformer(context.Background(), &corev1.ConfigMap{})
	if err != nil {
		return nil, fmt.Errorf("pools ConfigMap informer: %w", err)
	}
	set := func(obj any) {
		if cm, ok := obj.(*corev1.ConfigMap); ok && cm.Name == f.cm.Name && cm.Namespace == f.cm.Namespace {
			f.apply(cm)
		}
	}
	reg, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    set,
		UpdateFunc: func(_, obj any) { set(obj) },
		DeleteFunc: func(obj any) {
			if cm, ok := tombstone(obj).(*corev1.ConfigMap); ok && cm.Name == f.cm.Name && cm.Namespace == f.cm.Namespace {
				f.apply(nil)
			}
		},
	})
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	f.synced = reg.HasSynced
	f.mu.Unlock()
	return reg, nil
}

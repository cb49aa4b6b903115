package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/topology"
	"github.com/nvdomain/nvdomain/pkg/topology/source"
)

// flakySource is NVML that cannot be loaded for the first failures loads, then a topology.
type flakySource struct {
	mu       sync.Mutex
	failures int
	loads    int
	nvml     source.NVML
	top      *topology.Topology
}

func (s *flakySource) Describe() string         { return "NVML" }
func (s *flakySource) Changes() <-chan struct{} { return nil }
func (s *flakySource) count() int               { s.mu.Lock(); defer s.mu.Unlock(); return s.loads }
func (s *flakySource) Load(ctx context.Context) (*topology.Topology, error) {
	s.mu.Lock()
	s.loads++
	fail := s.loads <= s.failures
	s.mu.Unlock()
	if fail {
		return s.nvml.Load(ctx)
	}
	return s.top, nil
}

func condition(t *testing.T, c *fake.Clientset, typ corev1.NodeConditionType) *corev1.NodeCondition {
	t.Helper()
	node, err := c.CoreV1().Nodes().Get(context.Background(), "gpu-node01", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cond := range node.Status.Conditions {
		if cond.Type == typ {
			return &cond
		}
	}
	return nil
}

// TestNVMLThatCannotLoadIsACondition: an agent whose NVML cannot be loaded (no driver library
// in the container) stays up, not ready, and says so on the Node, with the fix, once per
// distinct error; when NVML comes, it publishes and the condition turns True. The kubelet's
// own conditions are left alone.
func TestNVMLThatCannotLoadIsACondition(t *testing.T) {
	ready := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady"}
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-node01"}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{ready}}})
	lib := &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }}
	src := &flakySource{failures: 3, nvml: source.NVML{Lib: lib}, top: seed(t)}
	a := New(Options{Names: names.Default(), Node: "gpu-node01", Source: src, Client: client, Period: time.Hour, RetryInitial: 20 * time.Millisecond, Log: logr.Discard(), Metrics: newMetrics()})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()

	deadline := time.Now().Add(10 * time.Second)
	for !a.Ready() && time.Now().Before(deadline) {
		if src.count() == 2 {
			c := condition(t, client, names.ConditionTopology)
			if c == nil || c.Status != corev1.ConditionFalse || c.Reason != "SourceUnavailable" || !strings.Contains(c.Message, "libnvidia-ml.so.1") || !strings.Contains(c.Message, "runtimeClassName") {
				t.Errorf("while NVML cannot load, condition %+v: want False/SourceUnavailable naming the library and the fix", c)
			}
			if a.Ready() {
				t.Error("ready without a topology")
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !a.Ready() {
		t.Fatalf("not ready after NVML came back (%d loads)", src.count())
	}
	c := condition(t, client, names.ConditionTopology)
	if c == nil || c.Status != corev1.ConditionTrue || c.Reason != "Published" {
		t.Errorf("after the first topology, condition %+v: want True/Published", c)
	}
	if k := condition(t, client, corev1.NodeReady); k == nil || k.Status != corev1.ConditionTrue || k.Reason != "KubeletReady" {
		t.Errorf("the kubelet's Ready condition became %+v", k)
	}
	evs, _ := client.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{})
	unavailable := 0
	for _, e := range evs.Items {
		if e.Reason == "TopologyUnavailable" {
			unavailable++
		}
	}
	if unavailable != 1 {
		t.Errorf("%d TopologyUnavailable Events for three identical failures, want 1", unavailable)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

func TestRunEndsQuietlyWhileWaiting(t *testing.T) {
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-node01"}})
	src := &flakySource{failures: 1 << 30, nvml: source.NVML{Lib: &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED }}}}
	a := New(Options{Names: names.Default(), Node: "gpu-node01", Source: src, Client: client, Period: time.Hour, RetryInitial: time.Millisecond, Log: logr.Discard(), Metrics: newMetrics()})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := a.Run(ctx); err != nil {
		t.Errorf("Run on shutdown while waiting: %v, want nil", err)
	}
	if _, err := a.WaitForTopology(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitForTopology after ctx ended: %v", err)
	}
}

// overlaySource loads top once, then fails (a GPU fell off the bus), and marks GPU 3 in the
// topology kept meanwhile, as source.NVML does with its XID watcher.
type overlaySource struct {
	top     *topology.Topology
	loads   atomic.Int32
	changes chan struct{}
}

func (s *overlaySource) Describe() string         { return "NVML" }
func (s *overlaySource) Changes() <-chan struct{} { return s.changes }
func (s *overlaySource) Load(context.Context) (*topology.Topology, error) {
	if s.loads.Add(1) == 1 {
		return s.top, nil
	}
	return nil, errors.New("NVML: open GPU 3: GPU is lost")
}
func (s *overlaySource) Overlay(top *topology.Topology) *topology.Topology {
	if top.GPUs[3].Unhealthy != "" {
		return top
	}
	c := *top
	c.GPUs = append([]topology.GPU(nil), top.GPUs...)
	c.GPUs[3].Unhealthy = "XID 79"
	return &c
}

// A source that fails after a GPU fell off the bus keeps the last good topology published
// (stale), and the marks it still knows reach that topology: the DRA driver is handed it
// (TopologyLoaded), once, and only after the Node's topology annotation shows it, so the
// webhook's hint and `nvdomain status` never lag the allocator (review DRA 2026-12 #6).
func TestAKeptTopologyTakesTheSourcesMarks(t *testing.T) {
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-node01"}})
	src := &overlaySource{top: seed(t), changes: make(chan struct{}, 1)}
	var mu sync.Mutex
	var loaded []string
	var annotationLags []string
	a := New(Options{Names: names.Default(), Node: "gpu-node01", Source: src, Client: client, Period: time.Hour, RetryInitial: 20 * time.Millisecond,
		Log: logr.Discard(), Metrics: newMetrics(), TopologyLoaded: func(ctx context.Context, top *topology.Topology) {
			mu.Lock()
			defer mu.Unlock()
			loaded = append(loaded, top.GPUs[3].Unhealthy)
			node, err := client.CoreV1().Nodes().Get(ctx, "gpu-node01", metav1.GetOptions{})
			if err != nil {
				annotationLags = append(annotationLags, err.Error())
				return
			}
			var published topology.Topology
			if err := json.Unmarshal([]byte(node.Annotations[names.Default().TopologyAnnotation()]), &published); err != nil || len(published.GPUs) < 4 || published.GPUs[3].Unhealthy != top.GPUs[3].Unhealthy {
				annotationLags = append(annotationLags, fmt.Sprintf("driver handed GPU 3 unhealthy %q while the Node showed %+v (%v)", top.GPUs[3].Unhealthy, published.GPUs, err))
			}
		}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = a.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for !a.Ready() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	for range 2 { // the mark, then a round that changes nothing
		src.changes <- struct{}{}
		for n := src.loads.Load(); src.loads.Load() == n && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
	}
	time.Sleep(100 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if len(loaded) != 2 || loaded[0] != "" || loaded[1] != "XID 79" {
		t.Errorf("topologies handed on: GPU 3 unhealthy %q, want the good one and then the kept one marked, once", loaded)
	}
	if len(annotationLags) > 0 {
		t.Errorf("the DRA driver got a topology before the Node showed it: %v", annotationLags)
	}
}

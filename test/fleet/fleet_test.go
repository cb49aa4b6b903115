package fleet

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nvdomain/nvdomain/pkg/agent"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/topology/simulated"
)

var n = names.Default()

const fleetDoc = `{"nodes":[
 {"name":"hgx-1","gpuCount":8,"domains":[{"gpus":[0,1,2,3,4,5,6,7]}]},
 {"name":"split-1","gpuCount":8,"domains":[{"gpus":[0,1,2,3]},{"gpus":[4,5,6,7]}]},
 {"name":"pcie-1","gpuCount":8}]}`

const fleetDocGrown = `{"nodes":[
 {"name":"hgx-1","gpuCount":8,"domains":[{"gpus":[0,1,2,3,4,5,6,7]}]},
 {"name":"pcie-1","gpuCount":8},
 {"name":"hgx-2","gpuCount":8,"domains":[{"gpus":[0,1,2,3,4,5,6,7]}]}]}`

// The fleet publishes every node of the document exactly as a node's own agent would
// (agent.Desire through a Publisher per node), picks up nodes added to the document, and marks a
// node that left the document stale, keeping its last topology.
func TestFleetPublishesEveryNodeOfTheDocument(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var nodes []*corev1.Node
	for _, name := range []string{"hgx-1", "split-1", "pcie-1", "hgx-2"} {
		nodes = append(nodes, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"foreign": "kept"}}})
	}
	client := fake.NewClientset(nodes[0], nodes[1], nodes[2], nodes[3])
	path := filepath.Join(t.TempDir(), "topology.json")
	if err := os.WriteFile(path, []byte(fleetDoc), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := simulated.NewParser()
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewFleetMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	f := &Fleet{Names: n, Doc: &DocumentFile{Path: path, Parser: p}, Client: client, Period: 50 * time.Millisecond, Log: logr.Discard(), Metrics: m}
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()

	// want is what a node's own agent would publish for it.
	want := func(doc, node string) agent.Desired {
		t.Helper()
		parsed, err := p.Parse([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		top, err := parsed.ForNode(node)
		if err != nil {
			t.Fatal(err)
		}
		d, err := agent.Desire(n, top, nil, agent.Health{})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	published := func(node string, d agent.Desired, stale bool) bool {
		got, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return false
		}
		if got.Labels["foreign"] != "kept" || (got.Labels[n.TopologyStaleLabel()] == "true") != stale {
			return false
		}
		for k, v := range d.Labels {
			if got.Labels[k] != v {
				return false
			}
		}
		for k, v := range d.Annotations {
			if got.Annotations[k] != v {
				return false
			}
		}
		for k, v := range d.Capacity {
			q, ok := got.Status.Capacity[corev1.ResourceName(k)]
			if !ok || q.Value() != v {
				return false
			}
		}
		return true
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) { return cond(), nil }); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	waitFor("every node of the document published", func() bool {
		return f.Ready() && published("hgx-1", want(fleetDoc, "hgx-1"), false) &&
			published("split-1", want(fleetDoc, "split-1"), false) && published("pcie-1", want(fleetDoc, "pcie-1"), false)
	})
	if got, _ := client.CoreV1().Nodes().Get(ctx, "split-1", metav1.GetOptions{}); len(got.Status.Capacity) != 2 {
		t.Fatalf("split-1 capacity = %v, want its two domain resources", got.Status.Capacity)
	}
	if got, _ := client.CoreV1().Nodes().Get(ctx, "hgx-2", metav1.GetOptions{}); len(got.Labels) != 1 {
		t.Fatalf("hgx-2 is not in the document yet but got labels %v", got.Labels)
	}

	// The file changes: hgx-2 joins, split-1 leaves. A later modification time makes sure
	// the change is seen even on a file system with coarse timestamps.
	if err := os.WriteFile(path, []byte(fleetDocGrown), 0o644); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(2 * time.Second)
	if err := os.Chtimes(path, later, later); err != nil {
		t.Fatal(err)
	}
	waitFor("hgx-2 published and split-1 marked stale", func() bool {
		return published("hgx-2", want(fleetDocGrown, "hgx-2"), false) && published("split-1", want(fleetDoc, "split-1"), true)
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

func TestFleetRefusesABadDocumentAtStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "topology.json")
	if err := os.WriteFile(path, []byte(`{"nodes":[{"name":"a"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := simulated.NewParser()
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewFleetMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	f := &Fleet{Names: n, Doc: &DocumentFile{Path: path, Parser: p}, Client: fake.NewClientset(), Period: time.Second, Log: logr.Discard(), Metrics: m}
	if err := f.Run(context.Background()); err == nil || !errors.Is(err, agent.ErrNoTopology) {
		t.Fatalf("Run = %v, want agent.ErrNoTopology", err)
	}
}

// A thousand node agents reading an unchanged file share one parse.
func TestDocumentFileParsesOncePerVersion(t *testing.T) {
	path := filepath.Join(t.TempDir(), "topology.json")
	if err := os.WriteFile(path, []byte(fleetDoc), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := simulated.NewParser()
	if err != nil {
		t.Fatal(err)
	}
	src := &DocumentFile{Path: path, Parser: p}
	a, err := src.Document(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := src.Document(context.Background())
	if a != b {
		t.Fatal("an unchanged file was parsed again")
	}
	if err := os.WriteFile(path, []byte(fleetDocGrown), 0o644); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(2 * time.Second)
	if err := os.Chtimes(path, later, later); err != nil {
		t.Fatal(err)
	}
	c, err := src.Document(context.Background())
	if err != nil || c == a || len(c.Nodes) != 3 || c.Nodes[2].Name != "hgx-2" {
		t.Fatalf("the changed file was not read again: %v %v", c, err)
	}
}

// Package agent is nvdomain's node agent: it turns this node's topology into the labels,
// annotations and per-domain extended resources of docs/architecture.md (Names), and keeps
// them true. On a DRA node (--dra) it runs the DRA driver of package dra instead of publishing
// extended resources. It owns only its own keys (those the names package can parse back),
// removes the ones that no longer apply, never touches anyone else's, re-asserts everything on
// a period and on change, keeps the last good topology published when its source breaks, and
// lowers a domain's capacity by the GPUs that unpinned containers hold there (reported by the
// NRI plugin's state file). A Fleet runs one agent per node of a simulated topology in one
// process, for fake nodes that run no agent of their own.
package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/topology"
)

// Desired is what the node should say about itself.
type Desired struct {
	Labels      map[string]string
	Annotations map[string]string
	// Capacity per domain resource, after unpinned usage is subtracted.
	Capacity map[string]int64
}

// Health is what the agent knows about the topology it publishes.
type Health struct {
	// Stale marks a topology kept from before the source broke.
	Stale bool
	// Mismatch marks a node whose NRI plugin serves another topology than this one.
	Mismatch bool
	// FailOpen marks a node whose fail-closed canary ran; WithholdCapacity then publishes
	// every domain with no room (canary.go). Unproven marks a node no canary was refused on
	// yet (a fresh node, or one whose canaries stay undecided): WithholdCapacity withholds its
	// room too, so a tensor-parallel pod never lands on a node before it is proven
	// fail-closed, and an autoscaler's node is initialized only once it is.
	FailOpen, Unproven, WithholdCapacity bool
	// PluginDisconnected marks a node whose NRI plugin has lost the runtime (its state file
	// says so): the node gets names.PluginDisconnectedLabel, which the webhook reads as an
	// unavailable node. Its capacity stays: the kubelet would reject running pods above it at
	// its next restart, which is when containerd restarts too.
	PluginDisconnected bool
	// Proof is the value of FailClosedProvenAnnotation: the node's boot ID while a canary
	// refused during this boot proves it, names.NotProven otherwise. It is always written, so
	// a node without it was last published by a release that did not write it (seedFailOpen).
	Proof string
}

// Desire computes the node's labels, annotations and capacity. unpinned[d] is the GPUs of
// domain d that containers without a domain hold.
func Desire(n names.Names, top *topology.Topology, unpinned map[int]int, h Health) (Desired, error) {
	d := Desired{Labels: map[string]string{}, Annotations: map[string]string{}, Capacity: map[string]int64{}}
	d.Labels[n.DomainCountLabel()] = strconv.Itoa(len(top.Domains))
	d.Labels[n.DomainMaxLabel()] = strconv.Itoa(top.MaxDomainSize())
	d.Labels[n.TopologySourceLabel()] = top.Source
	if h.Stale {
		d.Labels[n.TopologyStaleLabel()] = "true"
	}
	if h.Mismatch {
		d.Labels[n.TopologyMismatchLabel()] = "true"
	}
	if h.FailOpen {
		d.Labels[n.FailOpenLabel()] = "true"
	}
	if h.PluginDisconnected {
		d.Labels[n.PluginDisconnectedLabel()] = "true"
	}
	for _, dom := range top.Domains {
		d.Labels[n.DomainSizeLabel(dom.ID)] = strconv.Itoa(dom.Size())
		d.Annotations[n.DomainGPUsAnnotation(dom.ID)] = names.FormatGPUList(dom.GPUs)
		room := int64(max(0, dom.Size()-unpinned[dom.ID]))
		if (h.FailOpen || h.Unproven) && h.WithholdCapacity {
			room = 0
		}
		d.Capacity[n.DomainResource(dom.ID)] = room
	}
	// The multi-node NVLink clique (GB200/GB300 NVL72), in GFD's label and format. GPUs that
	// disagree put the node in no clique: a group must not count it in either.
	if f, ok, err := top.Clique(); err == nil && ok {
		d.Labels[names.GPUCliqueLabel] = f.Label()
		d.Annotations[n.CliquePublishedAnnotation()] = f.Label()
		if f.CliqueGPUs > 0 {
			d.Labels[n.CliqueGPUsLabel()] = strconv.Itoa(f.CliqueGPUs)
		}
		if f.CliqueNodes > 0 {
			d.Labels[n.CliqueNodesLabel()] = strconv.Itoa(f.CliqueNodes)
		}
	}
	doc, err := json.Marshal(top)
	if err != nil {
		return Desired{}, fmt.Errorf("encode topology: %w", err)
	}
	d.Annotations[n.TopologyAnnotation()] = string(doc)
	if h.Proof != "" {
		d.Annotations[n.FailClosedProvenAnnotation()] = h.Proof
	}
	return d, nil
}

// ForDRA is what a DRA node says about itself: the same labels and annotations, the mode
// label, and no per-domain capacity. The empty capacity makes the publisher remove the domain
// resources a classic agent left on the node, so no pinned pod is scheduled there.
func (d Desired) ForDRA(n names.Names) Desired {
	labels := make(map[string]string, len(d.Labels)+1)
	maps.Copy(labels, d.Labels)
	labels[n.ModeLabel()] = names.ModeDRA
	return Desired{Labels: labels, Annotations: d.Annotations, Capacity: map[string]int64{}}
}

// ownsLabel reports whether a label key is one the agent writes. The mode label is not among
// them: the operator sets it on a pool to choose the mode, a DRA agent only confirms it, and
// a classic agent must never remove it while its pod is being replaced by a DRA one.
func ownsLabel(n names.Names, key string) bool {
	if _, ok := n.ParseDomainSizeLabel(key); ok {
		return true
	}
	switch key {
	case n.DomainCountLabel(), n.DomainMaxLabel(), n.TopologySourceLabel(), n.TopologyStaleLabel(), n.TopologyMismatchLabel(), n.FailOpenLabel(), n.PluginDisconnectedLabel(),
		n.CliqueGPUsLabel(), n.CliqueNodesLabel():
		return true
	}
	return false
}

func ownsAnnotation(n names.Names, key string) bool {
	_, ok := n.ParseDomainGPUsAnnotation(key)
	return ok || key == n.TopologyAnnotation() || key == n.FailClosedProvenAnnotation() || key == n.CliquePublishedAnnotation()
}

// shareClique applies the clique label's ownership to what the agent desires of a node: the
// label is GFD's (names.GPUCliqueLabel). A value on the node that the agent did not write
// (CliquePublishedAnnotation differs) is kept as it is, and the agent writes neither the
// label nor its annotation; a value the agent wrote is the agent's to change, or to remove
// once its topology knows no clique (removeLabel). Both read the same NVML fabric info, so on
// real racks they agree; the rule only keeps them from fighting where they do not.
func shareClique(n names.Names, node *corev1.Node, d Desired) (out Desired, removeLabel bool) {
	cur, has := node.Labels[names.GPUCliqueLabel]
	ours := has && node.Annotations[n.CliquePublishedAnnotation()] == cur
	_, wants := d.Labels[names.GPUCliqueLabel]
	switch {
	case has && !ours:
		out = Desired{Labels: maps.Clone(d.Labels), Annotations: maps.Clone(d.Annotations), Capacity: d.Capacity}
		delete(out.Labels, names.GPUCliqueLabel)
		delete(out.Annotations, n.CliquePublishedAnnotation())
		return out, false
	case ours && !wants:
		return d, true
	}
	return d, false
}

// Publisher writes Desired onto one Node with patches scoped to the agent's own keys.
type Publisher struct {
	Client kubernetes.Interface
	Names  names.Names
	Node   string
}

// Result says what a Publish changed.
type Result struct {
	MetadataPatched, StatusPatched bool
}

// Publish reads the node and patches what differs: metadata (labels, annotations) with a JSON
// merge patch that sets the agent's keys and nulls its stale ones, and status.capacity (and
// allocatable, which a kubelet would mirror anyway, so that the scheduler sees the change at
// once) through the status subresource the same way. Keys the agent does not own are never in
// a patch.
func (p *Publisher) Publish(ctx context.Context, d Desired) (Result, error) {
	node, err := p.Client.CoreV1().Nodes().Get(ctx, p.Node, metav1.GetOptions{})
	if err != nil {
		return Result{}, fmt.Errorf("get node %s: %w", p.Node, err)
	}
	var res Result
	d, removeClique := shareClique(p.Names, node, d)
	labels := diff(node.Labels, d.Labels, func(k string) bool { return ownsLabel(p.Names, k) })
	if removeClique {
		labels[names.GPUCliqueLabel] = nil
	}
	annotations := diff(node.Annotations, d.Annotations, func(k string) bool { return ownsAnnotation(p.Names, k) })
	if len(labels) > 0 || len(annotations) > 0 {
		meta := map[string]any{}
		if len(labels) > 0 {
			meta["labels"] = labels
		}
		if len(annotations) > 0 {
			meta["annotations"] = annotations
		}
		body, _ := json.Marshal(map[string]any{"metadata": meta})
		if _, err := p.Client.CoreV1().Nodes().Patch(ctx, p.Node, types.MergePatchType, body, metav1.PatchOptions{FieldManager: "nvdomain-agent"}); err != nil {
			return res, fmt.Errorf("patch node %s labels and annotations: %w", p.Node, err)
		}
		res.MetadataPatched = true
	}
	status := map[string]any{}
	for _, field := range []struct {
		name string
		list corev1.ResourceList
	}{{"capacity", node.Status.Capacity}, {"allocatable", node.Status.Allocatable}} {
		if change := resourceDiff(p.Names, field.list, d.Capacity); len(change) > 0 {
			status[field.name] = change
		}
	}
	if len(status) > 0 {
		body, _ := json.Marshal(map[string]any{"status": status})
		if _, err := p.Client.CoreV1().Nodes().Patch(ctx, p.Node, types.MergePatchType, body, metav1.PatchOptions{FieldManager: "nvdomain-agent"}, "status"); err != nil {
			return res, fmt.Errorf("patch node %s capacity: %w", p.Node, err)
		}
		res.StatusPatched = true
	}
	return res, nil
}

// diff returns a merge-patch map: desired keys whose value differs, and owned keys that are no
// longer desired, set to nil (JSON null deletes them).
func diff(current, desired map[string]string, owned func(string) bool) map[string]any {
	out := map[string]any{}
	for k, v := range desired {
		if cur, ok := current[k]; !ok || cur != v {
			out[k] = v
		}
	}
	for k := range current {
		if _, keep := desired[k]; !keep && owned(k) {
			out[k] = nil
		}
	}
	return out
}

func resourceDiff(n names.Names, current corev1.ResourceList, desired map[string]int64) map[string]any {
	out := map[string]any{}
	for k, v := range desired {
		cur, ok := current[corev1.ResourceName(k)]
		if !ok || cur.Value() != v {
			out[k] = resource.NewQuantity(v, resource.DecimalSI).String()
		}
	}
	for k := range maps.Keys(current) {
		if _, keep := desired[string(k)]; !keep && n.IsDomainResource(string(k)) {
			out[string(k)] = nil
		}
	}
	return out
}

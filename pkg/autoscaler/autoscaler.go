// Package autoscaler says what an autoscaler must know of a declared GPU pool (docs/pools.md)
// to add a node for a pod that waits for it: the labels a new node of the pool will carry
// (the domain size labels a pinned pod's required affinity matches) and the extended
// resources it will offer (one per NVLink domain). It renders them for Karpenter (a
// NodeOverlay and the NodePool's template labels) and for the Cluster Autoscaler on AWS
// (node-template tags on the Auto Scaling group). Neither autoscaler learns them any other
// way: a node that does not exist has no agent to publish them.
package autoscaler

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/topology/simulated"
)

// Labels are the labels every node of the pool carries once its agent has published it:
// the pool's declared other labels, its nodeSelector and the domain labels pkg/agent's
// Desire writes for the shape.
func Labels(p simulated.Pool, n names.Names) map[string]string {
	out := make(map[string]string, len(p.Labels)+len(p.NodeSelector)+len(p.Topology.Domains)+2)
	maps.Copy(out, p.Labels)
	maps.Copy(out, p.NodeSelector)
	out[n.DomainCountLabel()] = strconv.Itoa(len(p.Topology.Domains))
	out[n.DomainMaxLabel()] = strconv.Itoa(p.Topology.MaxDomainSize())
	for _, d := range p.Topology.Domains {
		out[n.DomainSizeLabel(d.ID)] = strconv.Itoa(d.Size())
	}
	return out
}

// DomainLabels are Labels less the pool's nodeSelector and declared labels (the NodePool
// has those already): what a NodePool's template must add so that the autoscaler sees a new
// node match a pinned pod's affinity.
func DomainLabels(p simulated.Pool, n names.Names) map[string]string {
	out := Labels(p, n)
	for _, own := range []map[string]string{p.NodeSelector, p.Labels} {
		for k := range own {
			delete(out, k)
		}
	}
	return out
}

// Capacity is what a node of the pool offers: each domain's resource, and with gpus the
// node's nvidia.com/gpu too, for instance types the provider does not know GPUs of (kwok's,
// or on-premises ones); a cloud provider already counts the GPUs of a GPU instance type.
func Capacity(p simulated.Pool, n names.Names, gpus bool) map[string]int64 {
	out := map[string]int64{}
	for _, d := range p.Topology.Domains {
		out[n.DomainResource(d.ID)] = int64(d.Size())
	}
	if gpus {
		out[names.GPUResource] = int64(len(p.Topology.GPUs))
	}
	return out
}

// Options choose what the renderings contain.
type Options struct {
	// GPUs adds nvidia.com/gpu to the capacity (Capacity).
	GPUs bool
}

// nodeOverlay is the part of Karpenter's karpenter.sh/v1alpha1 NodeOverlay nvdomain writes.
type nodeOverlay struct {
	APIVersion string          `json:"apiVersion"`
	Kind       string          `json:"kind"`
	Metadata   overlayMeta     `json:"metadata"`
	Spec       nodeOverlaySpec `json:"spec"`
}

type overlayMeta struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels"`
}

type nodeOverlaySpec struct {
	Requirements []requirement    `json:"requirements"`
	Capacity     map[string]int64 `json:"capacity"`
}

type requirement struct {
	Key      string   `json:"key"`
	Operator string   `json:"operator"`
	Values   []string `json:"values"`
}

// OverlayName is the NodeOverlay nvdomain renders for a pool.
func OverlayName(pool string) string { return "nvdomain-" + pool }

// Karpenter renders, for each pool, a NodeOverlay that adds the pool's domain resources to
// the instance types its nodes are made from (selected by the pool's nodeSelector, which
// NodeOverlay requirements match against well-known labels and the NodePool's template
// labels), preceded by a comment with the labels the NodePool's template must carry. Karpenter
// must run with the NodeOverlay feature gate on.
func Karpenter(doc *simulated.Document, n names.Names, o Options) ([]byte, error) {
	var b strings.Builder
	for i, p := range doc.Pools {
		if i > 0 {
			b.WriteString("---\n")
		}
		labels := DomainLabels(p, n)
		patch, err := yaml.Marshal(map[string]any{"spec": map[string]any{"template": map[string]any{"metadata": map[string]any{"labels": labels}}}})
		if err != nil {
			return nil, fmt.Errorf("pool %s: %w", p.Name, err)
		}
		fmt.Fprintf(&b, "# Pool %s: the NodePool whose nodes carry %s must also put these labels on them\n", p.Name, simulated.FormatSelector(p.NodeSelector))
		b.WriteString("# (a pinned pod's node affinity asks for them; Karpenter only knows the template's labels):\n")
		for _, line := range strings.Split(strings.TrimRight(string(patch), "\n"), "\n") {
			b.WriteString("#   " + line + "\n")
		}
		if len(p.Taints) > 0 {
			fmt.Fprintf(&b, "# and its spec.template.spec.taints must be the pool's declared taints (%s): the webhook sends only pods that tolerate them.\n", formatTaints(p.Taints))
		}
		no := nodeOverlay{APIVersion: "karpenter.sh/v1alpha1", Kind: "NodeOverlay",
			Metadata: overlayMeta{Name: OverlayName(p.Name), Labels: map[string]string{"app.kubernetes.io/managed-by": "nvdomain"}},
			Spec:     nodeOverlaySpec{Capacity: Capacity(p, n, o.GPUs)}}
		for _, k := range slices.Sorted(maps.Keys(p.NodeSelector)) {
			no.Spec.Requirements = append(no.Spec.Requirements, requirement{Key: k, Operator: "In", Values: []string{p.NodeSelector[k]}})
		}
		out, err := yaml.Marshal(no)
		if err != nil {
			return nil, fmt.Errorf("pool %s: %w", p.Name, err)
		}
		b.Write(out)
	}
	return []byte(b.String()), nil
}

// AWS renders, for each pool, the Cluster Autoscaler's node-template tags for the pool's
// Auto Scaling group (k8s.io/cluster-autoscaler/node-template/label/<key> and
// .../resources/<name>), one `key=value` a line, which the Cluster Autoscaler reads while the
// group is at zero nodes.
func AWS(doc *simulated.Document, n names.Names, o Options) []byte {
	var b strings.Builder
	for i, p := range doc.Pools {
		if i > 0 {
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "# Pool %s: tags for the Auto Scaling group of the nodes that carry %s\n", p.Name, simulated.FormatSelector(p.NodeSelector))
		labels := Labels(p, n)
		for _, k := range slices.Sorted(maps.Keys(labels)) {
			fmt.Fprintf(&b, "k8s.io/cluster-autoscaler/node-template/label/%s=%s\n", k, labels[k])
		}
		capacity := Capacity(p, n, o.GPUs)
		for _, k := range slices.Sorted(maps.Keys(capacity)) {
			fmt.Fprintf(&b, "k8s.io/cluster-autoscaler/node-template/resources/%s=%d\n", k, capacity[k])
		}
		for _, t := range p.Taints {
			fmt.Fprintf(&b, "k8s.io/cluster-autoscaler/node-template/taint/%s=%s:%s\n", t.Key, t.Value, t.Effect)
		}
	}
	return []byte(b.String())
}

func formatTaints(ts []simulated.Taint) string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.Key + "=" + t.Value + ":" + t.Effect
	}
	return strings.Join(out, ", ")
}

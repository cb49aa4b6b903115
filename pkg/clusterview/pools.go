package clusterview

import (
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"

	"github.com/nvdomain/nvdomain/pkg/autoscaler"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/placement"
	"github.com/nvdomain/nvdomain/pkg/topology/simulated"
)

// Pool is a declared GPU pool (docs/pools.md) as the view counts it: potential capacity that
// an autoscaler adds when a pod waits for it. Build it with PoolsOf.
type Pool struct {
	Name     string
	selector map[string]string
	taints   []corev1.Taint
	// node stands for any node of the pool: the pool's nodeSelector labels plus the domain
	// labels its agent will publish, which is what a pinned pod's required affinity matches.
	node    *corev1.Node
	domains []poolDomain
}

type poolDomain struct{ id, size int }

// Labels are the labels every node of the pool will carry once its agent has published it.
func (p Pool) Labels() map[string]string { return p.node.Labels }

// NodeSelector is the labels that make a node one of the pool's.
func (p Pool) NodeSelector() map[string]string { return p.selector }

// Sizes lists the sizes of the pool's domains, by domain id.
func (p Pool) Sizes() []int {
	sizes := make([]int, len(p.domains))
	for i, d := range p.domains {
		sizes[i] = d.size
	}
	return sizes
}

// PoolsOf turns a document's pools into the view's, each pool's node labels those
// autoscaler.Labels says its nodes will carry.
func PoolsOf(doc *simulated.Document, n names.Names) []Pool {
	if doc == nil {
		return nil
	}
	out := make([]Pool, 0, len(doc.Pools))
	for _, sp := range doc.Pools {
		var taints []corev1.Taint
		for _, t := range sp.Taints {
			taints = append(taints, corev1.Taint{Key: t.Key, Value: t.Value, Effect: corev1.TaintEffect(t.Effect)})
		}
		p := Pool{Name: sp.Name, selector: sp.NodeSelector, taints: taints, node: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "pool/" + sp.Name, Labels: autoscaler.Labels(sp, n)}}}
		for _, d := range sp.Topology.Domains {
			p.domains = append(p.domains, poolDomain{d.ID, d.Size()})
		}
		out = append(out, p)
	}
	return out
}

// PoolsFromConfigMap reads the pools a pools ConfigMap declares under its topology.json key
// (the webhook's feed and the CLI read it alike); a nil ConfigMap declares none.
func PoolsFromConfigMap(p *simulated.Parser, cm *corev1.ConfigMap, n names.Names) ([]Pool, error) {
	if cm == nil {
		return nil, nil
	}
	data, ok := cm.Data[simulated.ConfigMapKey]
	if !ok {
		return nil, fmt.Errorf("no %s key", simulated.ConfigMapKey)
	}
	doc, err := p.Parse([]byte(data))
	if err != nil {
		return nil, err
	}
	return PoolsOf(doc, n), nil
}

// SetPools replaces the declared pools. A pod that waits for a pool is not changed by it:
// pools only make a pod that no node can hold now admissible, with a domain id to wait in.
// The same pools again (an informer resync) change nothing, so the re-pin controller does not
// look again at workloads it gave up on.
func (v *View) SetPools(pools []Pool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if slices.EqualFunc(v.pools, pools, samePool) {
		return
	}
	v.pools = slices.Clone(pools)
	v.nodeGen.Add(1)
	v.gen.Add(1)
}

// samePool compares what PoolsOf builds (its taints never carry a TimeAdded).
func samePool(a, b Pool) bool {
	return a.Name == b.Name && maps.Equal(a.selector, b.selector) && maps.Equal(a.node.Labels, b.node.Labels) &&
		slices.Equal(a.domains, b.domains) && slices.Equal(a.taints, b.taints)
}

// admits reports whether a pod may run on the pool's nodes: labels and taints.
func (p *Pool) admits(pod *corev1.Pod, req nodeaffinity.RequiredNodeAffinity) bool {
	if ok, _ := req.Match(p.node); !ok {
		return false
	}
	return tolerates(p.taints, pod.Spec.Tolerations)
}

// Pools returns the declared pools.
func (v *View) Pools() []Pool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return slices.Clone(v.pools)
}

// considerPoolsLocked feeds the chooser the domains of every pool whose nodes the pod may run
// on: its node selector and required affinity against the pool's labels, its tolerations
// against the pool's declared taints (an autoscaler adds no node for a pod that does not
// tolerate them); a pod bound to a node by name waits for no pool.
func (v *View) considerPoolsLocked(ch *placement.DomainChooser, pod *corev1.Pod, req nodeaffinity.RequiredNodeAffinity) {
	if pod.Spec.NodeName != "" {
		return
	}
	for i := range v.pools {
		p := &v.pools[i]
		if !p.admits(pod, req) {
			continue
		}
		for _, d := range p.domains {
			ch.Consider(placement.Candidate{Pool: p.Name, Domain: d.id, Capacity: d.size, Free: d.size})
		}
	}
}

// poolNamesLocked lists the declared pools' names, sorted (nil when none).
func (v *View) poolNamesLocked() []string {
	if len(v.pools) == 0 {
		return nil
	}
	out := make([]string, len(v.pools))
	for i, p := range v.pools {
		out[i] = p.Name
	}
	slices.Sort(out)
	return out
}

// WaitsForPool names the declared pools a pod pinned to domain d (k GPUs) waits for, in
// declaration order: none of the available nodes it may run on has domain d large enough
// (a cordoned or NotReady one does not count, as for the chooser), and these pools it may
// run on do (the autoscaler picks among them). Nil otherwise,
// including for a pod that waits for room on a node.
func (v *View) WaitsForPool(pod *corev1.Pod, d, k int) []string {
	v.mu.RLock()
	defer v.mu.RUnlock()
	if len(v.pools) == 0 || pod.Spec.NodeName != "" {
		return nil
	}
	req := nodeaffinity.GetRequiredNodeAffinity(pod)
	// The pools first: a handful, where the nodes are many (this runs in the validating
	// webhook for every pinned pod).
	var out []string
	for i := range v.pools {
		p := &v.pools[i]
		if !p.admits(pod, req) {
			continue
		}
		for _, pd := range p.domains {
			if pd.id == d && pd.size >= k {
				out = append(out, p.Name)
				break
			}
		}
	}
	if len(out) == 0 {
		return nil
	}
	// As the chooser: a cordoned or NotReady node the pod does not tolerate is not what it
	// waits for while a pool offers the domain.
	for _, nd := range v.nodes {
		if c, ok := nd.capacity[d]; ok && c >= k && eligible(pod, req, nd) && available(pod, nd) {
			return nil
		}
	}
	return out
}

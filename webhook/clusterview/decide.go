package clusterview

import (
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/placement"
)

// bucket is a set of identical (domain, capacity, free) entries, with one node as example.
type bucket struct {
	domain int
	cf     capFree
	nodes  int
	sample string
}

// ChooseDomain picks the domain id for a pod of k GPUs among the nodes the pod could run on
// (docs/architecture.md, "Choosing the domain id"): tightest fit now, else the domain id with
// the most capacity, else an *placement.ImpossibleError naming the largest domain the pod
// could ever get. Cordoned and NotReady nodes the pod does not tolerate count as capacity
// but not as room. seed spreads ties between equally tight ids (0: lowest id).
func (v *View) ChooseDomain(pod *corev1.Pod, k int, seed uint64) (placement.Decision, error) {
	reserved := v.liveReservations()
	v.mu.RLock()
	defer v.mu.RUnlock()
	buckets := v.bucketsLocked(pod)
	buckets = applyPending(buckets, v.pendingLocked(reserved))
	ch := placement.NewDomainChooser(k).Spread(seed)
	for _, b := range buckets {
		ch.ConsiderNodes(placement.Candidate{Node: b.sample, Domain: b.domain, Capacity: b.cf.capacity, Free: b.cf.free}, b.nodes)
	}
	dec, err := ch.Decide()
	if _, impossible := err.(*placement.ImpossibleError); impossible {
		// Rare, so spend a scan to name the nodes in the message.
		return dec, v.impossibleLocked(pod, k)
	}
	return dec, err
}

// bucketsLocked folds the nodes the pod could run on into (domain, capacity, free) buckets,
// from the histograms when the pod has no label constraints, else by scanning nodes.
func (v *View) bucketsLocked(pod *corev1.Pod) []bucket {
	type key struct {
		domain int
		cf     capFree
	}
	acc := map[key]*bucket{}
	add := func(d int, cf capFree, count int, sample string) {
		b := acc[key{d, cf}]
		if b == nil {
			b = &bucket{domain: d, cf: cf, sample: sample}
			acc[key{d, cf}] = b
		}
		b.nodes += count
		if sample != "" && (b.sample == "" || sample < b.sample) {
			b.sample = sample
		}
	}
	if !v.hasNodeConstraints(pod) {
		for tk, byDomain := range v.hist {
			if len(byDomain) == 0 {
				continue
			}
			ts := v.taintSets[tk]
			if !tolerates(ts.hard, pod.Spec.Tolerations) {
				continue
			}
			room := tolerates(ts.avail, pod.Spec.Tolerations)
			for d, counts := range byDomain {
				for cf, c := range counts {
					if !room {
						cf.free = 0
					}
					add(d, cf, c, "")
				}
			}
		}
	} else {
		req := nodeaffinity.GetRequiredNodeAffinity(pod)
		for name, nd := range v.nodes {
			if len(nd.capacity) == 0 || !eligible(pod, req, nd) {
				continue
			}
			room := available(pod, nd)
			for d, cf := range nd.histFree {
				if !room {
					cf.free = 0
				}
				add(d, cf, 1, name)
			}
		}
	}
	out := make([]bucket, 0, len(acc))
	for _, b := range acc {
		out = append(out, *b)
	}
	// Deterministic order for applyPending and the chooser's example node.
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.domain != b.domain {
			return a.domain < b.domain
		}
		if a.cf.free != b.cf.free {
			return a.cf.free < b.cf.free
		}
		return a.cf.capacity < b.cf.capacity
	})
	return out
}

func (v *View) pendingLocked(reserved map[demand]int) map[demand]int {
	out := make(map[demand]int, len(v.pending)+len(reserved))
	for k, c := range v.pending {
		out[k] += c
	}
	for k, c := range reserved {
		out[k] += c
	}
	return out
}

// applyPending lets pods that are pinned but not yet bound take their GPUs from the tightest
// buckets of their domain, largest pods first, the way the webhook would have placed them.
// Pods of one size move whole groups of identical nodes at once, so the cost depends on the
// number of distinct (domain, size) demands and buckets, not on how many pods wait.
func applyPending(buckets []bucket, pending map[demand]int) []bucket {
	keys := make([]demand, 0, len(pending))
	for k := range pending {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].domain != keys[j].domain {
			return keys[i].domain < keys[j].domain
		}
		return keys[i].gpus > keys[j].gpus
	})
	for _, k := range keys {
		if k.gpus <= 0 {
			continue
		}
		for m := pending[k]; m > 0; {
			best := -1
			for i, b := range buckets {
				if b.domain != k.domain || b.nodes == 0 || b.cf.free < k.gpus {
					continue
				}
				if best < 0 || b.cf.free < buckets[best].cf.free {
					best = i
				}
			}
			if best < 0 {
				break // the rest wait for GPUs that are not free yet
			}
			// Each node of the bucket takes as many of these pods as fit.
			per := buckets[best].cf.free / k.gpus
			nodes := min(buckets[best].nodes, (m+per-1)/per)
			taken := min(m, nodes*per)
			full := taken / per
			src := buckets[best]
			buckets[best].nodes -= nodes
			if full > 0 {
				buckets = append(buckets, bucket{domain: k.domain, cf: capFree{src.cf.capacity, src.cf.free - per*k.gpus}, nodes: full, sample: src.sample})
			}
			if rest := taken - full*per; rest > 0 {
				buckets = append(buckets, bucket{domain: k.domain, cf: capFree{src.cf.capacity, src.cf.free - rest*k.gpus}, nodes: 1, sample: src.sample})
			}
			m -= taken
		}
	}
	return buckets
}

func (v *View) impossibleLocked(pod *corev1.Pod, k int) error {
	req := nodeaffinity.GetRequiredNodeAffinity(pod)
	ch := placement.NewDomainChooser(k)
	for name, nd := range v.nodes {
		if !eligible(pod, req, nd) {
			continue
		}
		for d, c := range nd.capacity {
			ch.Consider(placement.Candidate{Node: name, Domain: d, Capacity: c})
		}
	}
	_, err := ch.Decide()
	return err
}

// LargestDomain is the size of the largest domain in the cluster, for messages.
func (v *View) LargestDomain() int {
	v.mu.RLock()
	defer v.mu.RUnlock()
	m := 0
	for _, nd := range v.nodes {
		for _, c := range nd.capacity {
			m = max(m, c)
		}
		for _, c := range nd.draSizes {
			m = max(m, c)
		}
	}
	return m
}

// PinNonTP says whether auto mode pins non-TP GPU pods: only while every GPU node has NVLink
// domains, since a pinned pod can only run on nodes that have its domain.
func (v *View) PinNonTP() bool {
	v.mu.RLock()
	defer v.mu.RUnlock()
	return v.gpuNodes > 0 && v.gpuNodesWithoutDomains == 0
}

// Advertisers lists the nvidia.com/ resources some node advertises, sorted.
func (v *View) Advertisers() map[string]int {
	v.mu.RLock()
	defer v.mu.RUnlock()
	out := make(map[string]int, len(v.advertised))
	for r, c := range v.advertised {
		out[r] = c
	}
	return out
}

// SelectedNode is a node a pod's labels select, with what it advertises.
type SelectedNode struct {
	Name           string
	WorkloadConfig string
	Resources      []string
}

// SelectedNodes lists, sorted by name, the nodes a pod with node constraints selects by
// labels (taints aside: a taint is not what makes a pod ask for the wrong resource name).
// A pod without constraints selects every node, which is not what split-inventory warnings
// are about; it gets nil.
func (v *View) SelectedNodes(pod *corev1.Pod) []SelectedNode {
	if !v.hasNodeConstraints(pod) {
		return nil
	}
	req := nodeaffinity.GetRequiredNodeAffinity(pod)
	v.mu.RLock()
	defer v.mu.RUnlock()
	var out []SelectedNode
	for name, nd := range v.nodes {
		if pod.Spec.NodeName != "" && pod.Spec.NodeName != name {
			continue
		}
		if ok, _ := req.Match(nd.obj); !ok {
			continue
		}
		out = append(out, SelectedNode{Name: name, WorkloadConfig: nd.obj.Labels[names.WorkloadConfigLabel], Resources: slices.Clone(nd.resources)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Free returns a node's free GPUs per domain (capacity minus bound pods), for tests and
// debugging endpoints.
func (v *View) Free(nodeName string) map[int]int {
	v.mu.RLock()
	defer v.mu.RUnlock()
	nd, ok := v.nodes[nodeName]
	if !ok {
		return nil
	}
	out := map[int]int{}
	for d := range nd.capacity {
		out[d] = v.free(nodeName, nd, d)
	}
	return out
}

package cli

import (
	"context"
	"fmt"
	"sort"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nvdomain/nvdomain/pkg/clusterview"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/placement"
	"github.com/nvdomain/nvdomain/pkg/repin"
	"github.com/nvdomain/nvdomain/pkg/rules"
	"github.com/nvdomain/nvdomain/pkg/topology"
)

// listPageSize bounds each list call, so a large cluster is read in pages as kubectl does.
const listPageSize = 500

// snapshot is the cluster as the webhook sees it, built once from a list of every node and
// every non-terminal pod: the webhook's own cluster view (clusterview.View) does the GPU
// counting, and the re-pin controller's own functions (repin.Waiting, repin.Unschedulable,
// placement.PlanRepins) decide which waiting pods are stranded. Nothing here counts GPUs.
type snapshot struct {
	names names.Names
	nodes []corev1.Node // sorted by name
	pods  []corev1.Pod
	view  *clusterview.View
	// waiting are the pinned, unbound pods in the re-pin controller's queue order.
	waiting []*corev1.Pod
	rooms   []placement.NodeRoom
	waiters []placement.Waiter
	// plan is the re-pin plan's verdict per waiter, by pod UID.
	plan map[string]placement.RepinDecision
	// poolsWarning says why the declared pools could not be read ("" when they were, or
	// when none are declared).
	poolsWarning string
}

// loadSnapshot lists the cluster's nodes and non-terminal pods.
func loadSnapshot(ctx context.Context, c kubernetes.Interface, n names.Names, pools string) (*snapshot, error) {
	var nodes []corev1.Node
	for cont := ""; ; {
		list, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{Limit: listPageSize, Continue: cont})
		if err != nil {
			return nil, fmt.Errorf("list nodes (the command needs list on nodes): %w", err)
		}
		nodes = append(nodes, list.Items...)
		if cont = list.Continue; cont == "" {
			break
		}
	}
	var pods []corev1.Pod
	for cont := ""; ; {
		list, err := c.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
			Limit: listPageSize, Continue: cont,
			FieldSelector: "status.phase!=" + string(corev1.PodSucceeded) + ",status.phase!=" + string(corev1.PodFailed),
		})
		if err != nil {
			return nil, fmt.Errorf("list pods in all namespaces (the command needs list on pods cluster-wide): %w", err)
		}
		pods = append(pods, list.Items...)
		if cont = list.Continue; cont == "" {
			break
		}
	}
	s := newSnapshot(n, nodes, pods)
	declared, warning, err := loadPools(ctx, c, n, pools)
	if err != nil {
		return nil, err
	}
	s.view.SetPools(declared)
	s.poolsWarning = warning
	return s, nil
}

// newSnapshot feeds the webhook's view with the nodes and pods and plans the re-pins.
func newSnapshot(n names.Names, nodes []corev1.Node, pods []corev1.Pod) *snapshot {
	s := &snapshot{names: n, nodes: nodes, pods: pods, view: clusterview.New(n)}
	sort.Slice(s.nodes, func(i, j int) bool { return s.nodes[i].Name < s.nodes[j].Name })
	for i := range s.nodes {
		s.view.UpsertNode(&s.nodes[i])
	}
	for i := range s.pods {
		s.view.UpsertPod(&s.pods[i])
	}
	s.waiting = repin.Waiting(s.pods, n)
	s.rooms, s.waiters = s.view.RepinInputs(s.waitingPods(nil))
	s.plan = map[string]placement.RepinDecision{}
	for _, d := range placement.PlanRepins(s.rooms, s.waiters) {
		s.plan[d.ID] = d
	}
	return s
}

// waitingPods hands the waiting pods to the view as the re-pin controller does: a pod may
// move once the scheduler has marked it Unschedulable. movable overrides that for the pods it
// names, to ask what the plan would say once the scheduler has tried them.
func (s *snapshot) waitingPods(movable map[string]bool) []clusterview.WaitingPod {
	out := make([]clusterview.WaitingPod, len(s.waiting))
	for i, p := range s.waiting {
		canMove := repin.Unschedulable(p)
		if movable[string(p.UID)] {
			canMove = true
		}
		out[i] = clusterview.WaitingPod{Pod: p, CanMove: canMove}
	}
	return out
}

// planAsUnschedulable is the plan's verdict for one waiter if the scheduler had already
// marked it Unschedulable.
func (s *snapshot) planAsUnschedulable(uid string) (placement.RepinDecision, bool) {
	rooms, waiters := s.view.RepinInputs(s.waitingPods(map[string]bool{uid: true}))
	for _, d := range placement.PlanRepins(rooms, waiters) {
		if d.ID == uid {
			return d, true
		}
	}
	return placement.RepinDecision{}, false
}

// waiter returns the plan's input for a pod and its place in the queue (0 first).
func (s *snapshot) waiter(uid string) (placement.Waiter, int, bool) {
	for i, w := range s.waiters {
		if w.ID == uid {
			return w, i, true
		}
	}
	return placement.Waiter{}, 0, false
}

func (s *snapshot) node(name string) *corev1.Node {
	i := sort.Search(len(s.nodes), func(i int) bool { return s.nodes[i].Name >= name })
	if i < len(s.nodes) && s.nodes[i].Name == name {
		return &s.nodes[i]
	}
	return nil
}

// podByUID finds a listed pod.
func (s *snapshot) podByUID(uid string) *corev1.Pod {
	for i := range s.pods {
		if string(s.pods[i].UID) == uid {
			return &s.pods[i]
		}
	}
	return nil
}

// nodeDomain is one domain of one node as the agent publishes it.
type nodeDomain struct {
	id   int
	size int
	gpus []int // from the node's GPU-list annotation; nil when it is missing or unreadable
}

// domainsOf reads a node's domains from every place the agent publishes them: the size
// labels, the GPU-list annotations and the allocatable domain resources. The size is the
// label's, else the GPU list's length, else the allocatable count (which the agent lowers by
// GPUs that unpinned containers hold, so it is the last resort).
func domainsOf(n names.Names, node *corev1.Node) []nodeDomain {
	byID := map[int]*nodeDomain{}
	get := func(id int) *nodeDomain {
		if byID[id] == nil {
			byID[id] = &nodeDomain{id: id, size: -1}
		}
		return byID[id]
	}
	for k, v := range node.Labels {
		if id, ok := n.ParseDomainSizeLabel(k); ok {
			if size, err := strconv.Atoi(v); err == nil && size >= 0 {
				get(id).size = size
			}
		}
	}
	for k, v := range node.Annotations {
		if id, ok := n.ParseDomainGPUsAnnotation(k); ok {
			if gpus, err := names.ParseGPUList(v); err == nil {
				get(id).gpus = gpus
			}
		}
	}
	alloc := map[int]int{}
	for res, q := range node.Status.Allocatable {
		if id, ok := n.ParseDomainResource(string(res)); ok {
			get(id)
			alloc[id] = int(q.Value())
		}
	}
	out := make([]nodeDomain, 0, len(byID))
	for id, d := range byID {
		switch {
		case d.size >= 0:
		case d.gpus != nil:
			d.size = len(d.gpus)
		default:
			d.size = alloc[id]
		}
		out = append(out, *d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

// deviceMinors maps a node's GPU indexes to the minor numbers of their device nodes
// (/dev/nvidia<minor>) from the agent's topology annotation; ok is false when the node has
// no readable annotation, and callers then fall back to the index, as topology.GPU does.
func deviceMinors(n names.Names, node *corev1.Node) (map[int]int, bool) {
	if node == nil {
		return nil, false
	}
	doc, found := node.Annotations[n.TopologyAnnotation()]
	if !found {
		return nil, false
	}
	var top topology.Topology
	if err := top.UnmarshalJSON([]byte(doc)); err != nil {
		return nil, false
	}
	out := make(map[int]int, len(top.GPUs))
	for _, g := range top.GPUs {
		out[g.Index] = g.DeviceMinor()
	}
	return out, true
}

// podGPUs is the GPUs a pod's running containers hold in its pinned domain, the quantity the
// view counts for it (rules.Inspect reads both).
func podGPUs(p rules.Pod) int {
	held := 0
	for _, c := range p.Containers {
		if !c.Init {
			held += c.DomainGPUs
		}
	}
	return held
}

// holdsGPUs reports whether the view counts the pod's GPUs on its node: bound, not terminal,
// not being deleted (clusterview.View.UpsertPod).
func holdsGPUs(pod *corev1.Pod) bool {
	return pod.Spec.NodeName != "" && pod.DeletionTimestamp == nil &&
		pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed
}

func podKey(p *corev1.Pod) string { return p.Namespace + "/" + p.Name }

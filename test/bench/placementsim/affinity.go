package placementsim

import (
	"fmt"
	"strconv"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"

	decision "github.com/nvdomain/nvdomain/pkg/admission"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/rules"
)

// pinAffinity is what the stock scheduler makes of a pinned pod's node affinity on one node:
// whether the required terms let it run there, and the NodeAffinity score of its preferred
// terms (before the scheduler scales scores to 0-100 over the nodes, which keeps their order).
type pinAffinity struct {
	fits  bool
	score int64
}

type affinityKey struct {
	gpus, domain, size int
	// hint: 0 the pod has no hint, 1 its hint names another node, 2 this one.
	hint int
	// What else of the decision the pin's terms depend on (admission.Preference).
	sizes              string
	capacity, leftOver int
}

var (
	affinityMu    sync.Mutex
	affinityCache = map[affinityKey]pinAffinity{}
)

// affinityOf is the node affinity of a pod of gpus GPUs pinned to domain id domain by the
// decision pref, judged on a node whose domain id has size GPUs and which the decision's hint
// names (hinted) or not. The pod is pinned by the webhook's own Pin, and its terms are matched
// by the helpers the scheduler's NodeAffinity plugin calls (k8s.io/component-helpers), so the
// simulation follows the weights and expressions production writes rather than a copy of
// them. The answer depends on these only, so it is worked out once per combination.
func affinityOf(gpus, domain, size int, hinted bool, pref decision.Preference) pinAffinity {
	key := affinityKey{gpus: gpus, domain: domain, size: size, sizes: fmt.Sprint(pref.Sizes), capacity: pref.Capacity, leftOver: pref.LeftOver}
	switch {
	case len(pref.Hint) > 0 && hinted:
		key.hint = 2
	case len(pref.Hint) > 0:
		key.hint = 1
	}
	if pref.Sizes == nil {
		key.sizes = "unknown"
	}
	affinityMu.Lock()
	defer affinityMu.Unlock()
	if a, ok := affinityCache[key]; ok {
		return a
	}
	a, err := judgeAffinity(key, pref.Sizes)
	if err != nil {
		// Pin writes terms the helpers always parse; anything else is a bug in this file.
		panic(err)
	}
	affinityCache[key] = a
	return a
}

func judgeAffinity(key affinityKey, sizes []int) (pinAffinity, error) {
	n := names.Default()
	q := *resource.NewQuantity(int64(key.gpus), resource.DecimalSI)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "job", Labels: map[string]string{names.TPLabel: names.TPLabelValue}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{
			Limits:   corev1.ResourceList{names.GPUResource: q},
			Requests: corev1.ResourceList{names.GPUResource: q},
		}}}},
	}
	// The hint, if any, names this node or another one.
	pref := decision.Preference{Sizes: sizes, Capacity: key.capacity, LeftOver: key.leftOver}
	switch key.hint {
	case 1:
		pref.Hint = []string{"other"}
	case 2:
		pref.Hint = []string{"node"}
	}
	pinned := decision.Pin(pod, rules.Inspect(pod, n), key.domain, pref, n)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node", Labels: map[string]string{
		n.DomainSizeLabel(key.domain): strconv.Itoa(key.size),
		corev1.LabelHostname:          "node",
	}}}
	fits, err := nodeaffinity.GetRequiredNodeAffinity(pinned).Match(node)
	if err != nil {
		return pinAffinity{}, fmt.Errorf("required affinity of a pod of %d GPUs pinned to domain %d: %w", key.gpus, key.domain, err)
	}
	var preferred []corev1.PreferredSchedulingTerm
	if na := pinned.Spec.Affinity.NodeAffinity; na != nil && len(na.PreferredDuringSchedulingIgnoredDuringExecution) > 0 {
		preferred = na.PreferredDuringSchedulingIgnoredDuringExecution
	}
	terms, err := nodeaffinity.NewPreferredSchedulingTerms(preferred)
	if err != nil {
		return pinAffinity{}, fmt.Errorf("preferred affinity of a pod of %d GPUs pinned to domain %d: %w", key.gpus, key.domain, err)
	}
	if !fits {
		// The scheduler scores only the nodes that pass the required terms.
		return pinAffinity{}, nil
	}
	return pinAffinity{fits: true, score: terms.Score(node)}, nil
}

package agent

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvdomain/nvdomain/pkg/nristate"
)

// HolderRecheck is how often the agent asks the API server again whether the pod behind a
// pinned container's GPUs is still the scheduler's to count.
const HolderRecheck = time.Minute

// holderCheck is what the agent last learnt of the pod behind pinned holds.
type holderCheck struct {
	at     time.Time
	orphan bool
}

// checkHolders finds the pinned containers whose GPUs the scheduler no longer counts: their
// pod object is gone (force-deleted while a process hangs in the driver, say), replaced by
// another of the same name, finished, or bound elsewhere, while the container lives on and
// the NRI plugin keeps its GPUs. Such GPUs are subtracted from the node's published room as
// unpinned ones are, so neither the scheduler nor the webhook sends a pod to room the plugin
// would refuse, and a refused pod moved away is not sent straight back (review classic H3).
// Each pod is asked about at most once per HolderRecheck; an answer the API server cannot
// give keeps the last one. It reports whether the orphaned usage changed.
func (a *Agent) checkHolders(ctx context.Context) bool {
	if a.o.Client == nil {
		return false
	}
	// One deadline for the whole pass: with the API unreachable, the agent's loop waits at
	// most this long, not a timeout per holder; the holders not asked are asked next pass.
	ctx, cancel := context.WithTimeout(ctx, holdersPassTimeout)
	defer cancel()
	now := time.Now()
	seen := map[string]bool{}
	changed := false
	for _, h := range a.holders {
		if h.PodUID == "" || seen[h.PodUID] {
			continue
		}
		seen[h.PodUID] = true
		if ctx.Err() != nil {
			continue // past the pass's deadline: the rest keep their last answers (seen) until the next pass
		}
		last, ok := a.holderChecks[h.PodUID]
		if ok && now.Sub(last.at) < HolderRecheck {
			continue
		}
		orphan, known := a.isOrphan(ctx, h)
		if !known {
			continue
		}
		if orphan != last.orphan || !ok {
			changed = changed || orphan != last.orphan
			if orphan {
				a.o.Log.Info("a container holds GPUs for a pod the scheduler no longer counts; its GPUs are left out of the node's room until it ends",
					"pod", h.PodNamespace+"/"+h.PodName, "podUID", h.PodUID, "container", h.ContainerName, "gpus", h.GPUs)
			}
		}
		a.holderChecks[h.PodUID] = holderCheck{at: now, orphan: orphan}
	}
	for uid, c := range a.holderChecks {
		if !seen[uid] {
			delete(a.holderChecks, uid)
			changed = changed || c.orphan
		}
	}
	if changed {
		a.unpinned = a.usage()
	}
	return changed
}

// holdersPassTimeout bounds one checkHolders pass's API calls together.
const holdersPassTimeout = 5 * time.Second

func (a *Agent) isOrphan(ctx context.Context, h nristate.Assignment) (orphan, known bool) {
	pod, err := a.o.Client.CoreV1().Pods(h.PodNamespace).Get(ctx, h.PodName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return true, true
	case err != nil:
		a.o.Metrics.Errors.WithLabelValues("holders").Inc()
		return false, false
	}
	return string(pod.UID) != h.PodUID || pod.Spec.NodeName != a.o.Node ||
		pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed, true
}

// usage is the GPUs of each domain the published room leaves out: those unpinned
// containers hold, and those of pinned containers whose pod the scheduler no longer counts
// (checkHolders).
func (a *Agent) usage() map[int]int {
	top := a.lastGood
	domainOf := func(g int) (int, bool) {
		if top == nil {
			return 0, false
		}
		gpu, ok := top.GPU(g)
		if !ok || gpu.Domain == nil {
			return 0, false
		}
		return *gpu.Domain, true
	}
	out := nristate.UnpinnedByDomain(&nristate.Doc{Assignments: a.unpinnedHolds}, domainOf)
	for _, h := range a.holders {
		if !a.holderChecks[h.PodUID].orphan {
			continue
		}
		for _, g := range h.GPUs {
			if d, ok := domainOf(g); ok {
				out[d]++
			}
		}
	}
	return out
}

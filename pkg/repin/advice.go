package repin

import (
	"errors"
	"fmt"
	"strings"
	"time"

	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/nvdomain/nvdomain/pkg/kubeevents"
	"github.com/nvdomain/nvdomain/pkg/placement"
)

// The texts below are what a user reads in a Stranded or RepinSkipped Event and in `kubectl
// nvdomain explain`: both build them here, so the two always say the same thing. Each names
// the cause first and then what the user can change.

// StrandedCause names why a stranded pod waits: its pinned domain is full for its GPUs on
// every node it may run on, while another domain has room. stranded, when not zero, is how
// long that has lasted.
func StrandedCause(dec placement.RepinDecision, gpus int, stranded time.Duration) string {
	s := fmt.Sprintf("its pinned NVSwitch domain %d is full: no node it may run on has %d GPUs of domain %d free", dec.From, gpus, dec.From)
	if stranded > 0 {
		s += " (for " + stranded.Round(time.Second).String() + ")"
	}
	return s + fmt.Sprintf(", while domain %d has room for it on node %s", dec.To, dec.Node)
}

// BarePodNote says why nvdomain leaves a stranded bare pod where it is.
const BarePodNote = "it has no owner, and nvdomain never deletes a pod that no controller recreates"

// StrandedFix is what the user can do for a stranded bare pod. It must be created again from
// its manifest: re-creating it from its live object (kubectl get -o yaml | kubectl replace
// --force) would carry the old pin, its domain resources and affinity included.
func StrandedFix(dec placement.RepinDecision, bare bool) string {
	if !bare {
		return fixes("delete the pod; its owner recreates it and the webhook pins the replacement to a domain with room", dec)
	}
	return fixes("delete the pod and create it again from its original manifest (not from `kubectl get -o yaml`, which carries the old pin), and the webhook pins it to a domain with room", dec) +
		"; or run it under a Deployment, StatefulSet or a Job whose podFailurePolicy ignores DisruptionTarget, so nvdomain moves it itself; or run the pool in DRA mode (docs/dra.md), where nothing is pinned"
}

// SkipFix is what the user can do for a stranded pod whose owners keep nvdomain from moving
// it (v.Skip): delete it by hand if its owner takes that, except for a Job's pod, whose
// deletion costs the Job a retry (the skip names the podFailurePolicy rule that avoids it).
func SkipFix(v OwnerVerdict, dec placement.RepinDecision) string {
	if len(v.Chain) > 0 && v.Chain[0].Kind == "Job" {
		return fixes("", dec)
	}
	return fixes(fmt.Sprintf("if its %s takes a restart of this pod, delete the pod: it is recreated and the webhook pins the replacement to a domain with room", v.Describe()), dec)
}

// fixes lists first (when given), then the fixes that always apply: room in the pinned domain
// or a smaller pod.
func fixes(first string, dec placement.RepinDecision) string {
	s := "Fix: "
	if first != "" {
		s += first + "; or "
	}
	return s + fmt.Sprintf("free domain %d (scale down or delete the pods that hold it on a node this pod may run on); or lower the pod's tensor-parallel size to fit the room there is", dec.From)
}

// NotDomainNote says why nvdomain leaves a stranded pod the scheduler rejects for something
// other than its GPUs or its domain (DomainBlocked): a new domain would not make it run.
const NotDomainNote = "the scheduler's reason is not its GPUs or its domain, and another domain would leave it just as Pending; fix the reason the scheduler gives"

// EvictionRefusal explains an eviction answered 429 Too Many Requests (why) and says what to
// change (fix). A Pending pod's eviction does not consult PodDisruptionBudgets, so a budget
// refuses only a pod that was running at that moment; otherwise the API server's priority and
// fairness throttled nvdomain.
func EvictionRefusal(err error, qps float64) (why, fix string) {
	budget := ""
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		if d := status.Status().Details; d != nil {
			for _, c := range d.Causes {
				if c.Type == policyv1.DisruptionBudgetCause {
					budget = c.Message
				}
			}
		}
	}
	if budget == "" && strings.Contains(err.Error(), "disruption budget") {
		budget = err.Error()
	}
	if budget != "" {
		return fmt.Sprintf("a PodDisruptionBudget allows no disruption now (%s); the pod was running at that moment, so nvdomain left it", budget),
			"Fix: if it is refused again, raise that PodDisruptionBudget's spec.maxUnavailable by one (or lower its spec.minAvailable by one), or set its spec.unhealthyPodEvictionPolicy: AlwaysAllow"
	}
	return fmt.Sprintf("the API server throttled nvdomain's evictions (API Priority and Fairness: %v); it is retried at the next pass", err),
		fmt.Sprintf("Fix: if this repeats, lower --repin-qps (now %g) or give nvdomain's service account a FlowSchema with a larger share", qps)
}

// NoRoomAdvice is the cause and fix for a pod that waits because no domain has room for its
// GPUs on a node it may run on: there is nothing to re-pin it to, so it runs when room frees.
func NoRoomAdvice(domain, gpus int) string {
	return fmt.Sprintf("no NVSwitch domain has room for %d GPUs on a node it may run on, and it runs when %d GPUs of domain %d free up on one. Fix, to run sooner: free %d GPUs of domain %d, or of any domain of at least %d GPUs, on a node it may run on (scale down or delete the pods there); or lower the pod's tensor-parallel size",
		gpus, gpus, domain, gpus, domain, gpus)
}

// MaxMovesWithoutRunning is how many times the controller moves a workload's pods without any
// of them running before it gives up on the workload. A move lands on room the webhook's own
// decision found; a replacement can strand again once when another pod takes that room
// first; a third time in a row says that the webhook's model of room and the scheduler's
// disagree about this workload (a constraint the view cannot judge, say), and moving it
// again would only repeat the eviction.
const MaxMovesWithoutRunning = 3

// GiveUpFor is the longest a workload given up on is left alone when nothing else changes:
// a change of the nodes, or a pod of the workload that stops stranding, ends it sooner.
const GiveUpFor = time.Hour

// MoveBackoff is how long after a workload's last move the controller waits before the
// repeat-th move of a replacement that stranded again: after·2^repeat (60s, 120s with the
// default --repin-after of 30s), so a workload the two models disagree about is evicted
// ever more rarely until it is given up on.
func MoveBackoff(after time.Duration, repeat int) time.Duration {
	return after << repeat
}

// MoveText names a move for the Repinned Event: the domain the pod leaves and the one the
// webhook pins its replacement to (To < 0: DRA nodes, where the allocator picks the domain).
func MoveText(dec placement.RepinDecision) string {
	if dec.To < 0 {
		return fmt.Sprintf("domain %d → DRA nodes", dec.From)
	}
	return fmt.Sprintf("domain %d → %d", dec.From, dec.To)
}

// NoRoomForReplacement says why a pod its node refuses is not moved: the webhook would pin
// its replacement to no domain with room now (the node's room is published without the GPUs
// the refusal is about), so an eviction would only bring another refusal or another wait.
const NoRoomForReplacement = "the webhook has no NVSwitch domain with room for its replacement now, so an eviction would only make it wait or be refused again; it is moved once room frees. Fix: free GPUs, or stop the container that holds its GPUs (the refusal names it)"

// WebhookDisagrees says why a stranded pod is not moved although the plan found room for it:
// the webhook, which pins the replacement, would not pin it to a domain with room now.
func WebhookDisagrees(domain int, fits bool, dec placement.RepinDecision) string {
	why := "the webhook would pin its replacement to the same domain"
	if domain != dec.From {
		why = fmt.Sprintf("the webhook would pin its replacement to domain %d", domain)
	}
	if domain >= 0 && !fits {
		why += ", where it would wait too"
	}
	return why + fmt.Sprintf(" (the room on node %s is taken, in its count, by pods pinned earlier or being created); nvdomain moves a pod only toward room the webhook gives it, so it waits. %s",
		dec.Node, fixes("", dec))
}

// GivenUpText is the RepinGivenUp Event: the workload was moved moves times and never ran.
func GivenUpText(cause string, moves int) string {
	return EventMessage("Stranded, no longer moved", fmt.Sprintf("its pods were moved %d times and none ran, so nvdomain stops moving them until the nodes change or an hour passes", moves),
		"Fix: run `kubectl nvdomain explain` on the pod for the scheduler's reason; check its node selector, affinity, tolerations and volumes against the nodes with room", cause)
}

// EventMessage is the text of a Stranded, RepinSkipped or RepinGivenUp Event, in the order a
// reader needs it within kubeevents.MaxMessage: the status, why (what keeps it so, when that
// is the news), the fix (its first clause: fix may go on with "; " and alternatives), then the
// cause in detail; cut to the cap. `kubectl nvdomain explain` prints every fix and the whole
// detail.
func EventMessage(status, why, fix, cause string) string {
	s := status + ":"
	if why != "" {
		s += " " + why + "."
	}
	more := false
	if fix != "" {
		first, rest, found := strings.Cut(fix, "; ")
		more = found && rest != ""
		s += " " + first + "."
	}
	s += " Cause: " + cause + "."
	if more {
		s += " More: kubectl nvdomain explain."
	}
	return kubeevents.Cap(s)
}

// RefusedCause names why a pod bound to a node does not start: the node's nvdomain plugin
// refuses its container (msg, the plugin's own words) for want of free GPUs.
func RefusedCause(node, msg string) string {
	return fmt.Sprintf("node %s refuses its container: %s", node, msg)
}

// RefusedBareFix is what the user can do for a bare pod the node refuses.
const RefusedBareFix = "Fix: delete the pod and create it again from its original manifest, and the webhook pins it where the counters have room; find what holds the GPUs with `kubectl nvdomain status` (a pod admitted while the webhook was down is counted once the agent sees it)"

// GatedNote explains a pinned pod held back by scheduling gates (a queueing system such as
// Kueue admits it later): its domain was chosen when it was created, from the room then, and a
// pod's resources cannot change, so the pin cannot follow the room when the gates go. A pod
// its owner recreates is moved like any stranded pod once ungated; a bare one cannot be.
func GatedNote(gates []string, domain int, bare bool) string {
	s := fmt.Sprintf("held back by scheduling gates (%s): the scheduler does not try it yet; its domain %d was chosen when it was created, from the room then, and is not chosen again when the gates go", strings.Join(gates, ", "), domain)
	if !bare {
		return s + "; if domain " + fmt.Sprint(domain) + " has no room then while another has, nvdomain moves it (its owner recreates it)"
	}
	return s + "; it has no owner, so if domain " + fmt.Sprint(domain) + " has no room then, it waits. Fix: create such pods through a Job or Deployment (Kueue's batch/v1 Job integration) so nvdomain can move them, or run the pool in DRA mode (docs/dra.md), where the domain is chosen at scheduling time"
}

// RoomReleasedNote is the Event on a pending pod whose GPU room nvdomain no longer holds: the
// scheduler has rejected it for reasons other than GPUs for hold (or judged it in no wording
// nvdomain reads for twice that).
func RoomReleasedNote(domain int, msg string, hold time.Duration) string {
	return fmt.Sprintf("the scheduler has rejected this pod for reasons other than GPUs for more than %s (%q), so nvdomain no longer holds the room of NVSwitch domain %d for it: other pods may take it, until this pod binds or is recreated. Fix: the scheduler's reason (pod affinity, topology spread, volumes, CPU or memory)", hold, msg, domain)
}

// BlockedNote says why a pod waits although nvdomain counts room for it in its pinned
// domain: the scheduler rejects it for what nvdomain does not judge (msg, its words).
func BlockedNote(domain int, msg string) string {
	return fmt.Sprintf("nvdomain counts room for it in its pinned NVSwitch domain %d, but the scheduler keeps it Pending (%q): what stops it is something nvdomain does not count, so another domain would not help and nvdomain does not move it. Fix: the scheduler's reason (pod affinity, topology spread, volumes, CPU or memory)", domain, msg)
}

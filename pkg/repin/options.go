// Package repin holds the re-pin rules that need no server: which pinned pods wait (Waiting),
// whether the scheduler's reason is their domain (DomainBlocked), whether their owners
// recreate an evicted pod (WalkOwners), the controller's options, and the Event texts that
// `nvdomain explain` shares with the controller. The controller itself, which applies
// placement.PlanRepins over the webhook's cluster view, is webhook/repin.
package repin

import (
	"flag"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nvdomain/nvdomain/pkg/names"
)

// Options configure the controller.
type Options struct {
	// Enabled turns the controller on; off, nothing is evicted and no Event is recorded.
	Enabled bool
	// After is how long a pod must have been stranded before it is moved: long enough for a
	// terminating predecessor to go and for the scheduler to retry, short enough that a user
	// does not notice.
	After time.Duration
	// Interval is the least time between two passes over the waiting pods; events in between
	// are folded into the next pass. A pass over a view that has not changed since the last
	// one only acts on the clock (After), without planning again. Re-pinning waits After
	// (30s) anyway, so a pass every 10s costs a stranded pod at most that much more, and a
	// large cluster with many waiters plans at most a tenth as often as it would every second.
	Interval time.Duration
	// QPS and Burst bound evictions cluster-wide, so that a surprise (a node pool vanishing)
	// never turns into an eviction storm.
	QPS   float64
	Burst int
	// OwnerKinds are the controllers, as Kind.group (Kind alone for the core group), that
	// recreate a pod that is evicted at no cost to anything else. Every controller from the
	// pod's up to its top-level owner must be one (Deployments and CronJobs always are); Job is
	// handled apart (OwnerSkipReason in owners.go).
	OwnerKinds []string
	// EventEvery is how often a Stranded or RepinSkipped Event is repeated for one pod.
	EventEvery time.Duration
}

// DefaultOwnerKinds recreate an evicted pod without counting it as a failure.
//
// LeaderWorkerSet is among them although evicting one pod restarts its whole group (with
// RecreateGroupOnPodRestart, the default; restartPolicy None replaces only the pod): a
// stranded member keeps its whole group from
// serving already, so the restart costs nothing the strand has not, and it is the only way the
// group gets room again. Only the stranded group is restarted; the LWS's other groups run on.
var DefaultOwnerKinds = []string{"ReplicaSet.apps", "StatefulSet.apps", "ReplicationController", LeaderWorkerSetKind}

// LeaderWorkerSetKind is LeaderWorkerSet as --repin-owner-kinds spells it.
const LeaderWorkerSetKind = names.LWSKind + "." + names.LWSGroup

// DefaultOptions are the documented defaults.
func DefaultOptions() Options {
	return Options{
		Enabled:    true,
		After:      30 * time.Second,
		Interval:   10 * time.Second,
		QPS:        2,
		Burst:      20,
		OwnerKinds: slices.Clone(DefaultOwnerKinds),
		EventEvery: 10 * time.Minute,
	}
}

// AddFlags registers the controller's flags on fs.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.BoolVar(&o.Enabled, "repin", o.Enabled, "re-pin stranded tensor-parallel pods (evict pods whose owner recreates them; Events for bare pods)")
	fs.DurationVar(&o.After, "repin-after", o.After, "how long a pod's pinned domain must have had no room, while another domain had, before it is re-pinned")
	fs.DurationVar(&o.Interval, "repin-interval", o.Interval, "least time between two passes of the re-pin controller (a pass over an unchanged cluster does not plan again)")
	fs.Float64Var(&o.QPS, "repin-qps", o.QPS, "evictions per second, cluster-wide")
	fs.IntVar(&o.Burst, "repin-burst", o.Burst, "evictions allowed at once")
	fs.Func("repin-owner-kinds", "comma-separated owner kinds (Kind.group) that recreate evicted pods; every owner up to the pod's top-level one must be listed, Deployments and CronJobs excepted (default "+strings.Join(DefaultOwnerKinds, ",")+")", func(s string) error {
		o.OwnerKinds = nil
		for _, k := range strings.Split(s, ",") {
			if k = strings.TrimSpace(k); k != "" {
				o.OwnerKinds = append(o.OwnerKinds, k)
			}
		}
		return nil
	})
	fs.DurationVar(&o.EventEvery, "repin-event-every", o.EventEvery, "how often a Stranded or RepinSkipped Event is repeated for one pod")
}

// Validate checks the options and names the flag at fault.
func (o Options) Validate() error {
	switch {
	case o.After < 0:
		return fmt.Errorf("--repin-after=%s: must not be negative", o.After)
	case o.Interval <= 0:
		return fmt.Errorf("--repin-interval=%s: must be positive, e.g. 10s", o.Interval)
	case o.QPS <= 0:
		return fmt.Errorf("--repin-qps=%g: must be positive; use --repin=false to turn re-pinning off", o.QPS)
	case o.Burst < 1:
		return fmt.Errorf("--repin-burst=%d: must be at least 1", o.Burst)
	case o.EventEvery <= 0:
		return fmt.Errorf("--repin-event-every=%s: must be positive", o.EventEvery)
	}
	for _, k := range o.OwnerKinds {
		if kind, _, _ := strings.Cut(k, "."); kind == "" || strings.ContainsAny(k, " /") {
			return fmt.Errorf("--repin-owner-kinds: %q is not Kind.group (e.g. StatefulSet.apps)", k)
		}
	}
	return nil
}

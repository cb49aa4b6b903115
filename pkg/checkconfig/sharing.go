package checkconfig

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/nvdomain/nvdomain/pkg/names"
)

// This file checks the resources a node advertises against what its MIG layout
// (nvidia.com/mig.config and a mig-parted config) and its time-slicing
// (nvidia.com/gpu.replicas) imply, and mig-manager's nvidia.com/mig.config.state.

// counts maps resource names to how many a node has (or should have).
type counts map[string]int64

// gpuFamily reports whether a resource is one that MIG layout and time-slicing decide:
// nvidia.com/gpu, nvidia.com/gpu.shared and the MIG profiles.
func gpuFamily(res string) bool {
	return res == names.GPUResource || res == names.SharedGPUResource || strings.HasPrefix(res, names.MIGResourcePrefix)
}

// advertised reads the node's capacity for the GPU family; a resource missing from capacity is
// read from allocatable, and unparseable quantities count as zero (Kubernetes would refuse them).
func (nd node) advertised() counts {
	out := counts{}
	for _, m := range []map[string]string{nd.Status.Allocatable, nd.Status.Capacity} {
		for res, q := range m {
			if !gpuFamily(res) {
				continue
			}
			v, err := resource.ParseQuantity(q)
			if err != nil {
				continue
			}
			out[res] = v.Value()
		}
	}
	return out
}

// intLabel reads a non-negative integer label.
func (nd node) intLabel(key string) (int, bool) {
	v, ok := nd.Metadata.Labels[key]
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(v)
	return n, err == nil && n >= 0
}

// replicas is the time-slicing factor: nvidia.com/gpu.replicas when it is above 1, else 1.
func (nd node) replicas() (int, string) {
	v, ok := nd.Metadata.Labels[names.GPUReplicasLabel]
	if !ok {
		return 1, ""
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 1, fmt.Sprintf("label %s=%q is not a positive number of replicas; GPU feature discovery writes the device plugin's sharing.timeSlicing replicas there", names.GPUReplicasLabel, v)
	}
	return n, ""
}

// renamed tells whether the device plugin renames time-sliced resources (renameByDefault):
// GFD marks the product "-SHARED", and the resources end in ".shared".
func (nd node) renamed(adv counts) bool {
	if strings.HasSuffix(nd.Metadata.Labels[names.GPUProductLabel], names.SharedProductSuffix) {
		return true
	}
	for res, n := range adv {
		if n > 0 && strings.HasSuffix(res, names.SharedResourceSuffix) {
			return true
		}
	}
	return false
}

// shared turns per-device counts into what the device plugin advertises with time-slicing:
// every device n times, under a ".shared" name when renamed.
func (c counts) shared(n int, renamed bool) counts {
	if n <= 1 {
		return c
	}
	out := counts{}
	for res, v := range c {
		if renamed {
			res += names.SharedResourceSuffix
		}
		out[res] = v * int64(n)
	}
	return out
}

// diff lists where adv departs from want, over the GPU family: a wanted count that differs,
// and an advertised resource nobody wanted. Zero and absent are the same.
func diff(want, adv counts) []string {
	var out []string
	for _, res := range sortedKeys(want, adv) {
		w, a := want[res], adv[res]
		switch {
		case w == a:
		case w == 0:
			out = append(out, fmt.Sprintf("%s=%d advertised, none expected", res, a))
		default:
			out = append(out, fmt.Sprintf("%s=%d expected, %d advertised", res, w, a))
		}
	}
	return out
}

func sortedKeys(ms ...counts) []string {
	var out []string
	for _, m := range ms {
		for k := range m {
			if !slices.Contains(out, k) {
				out = append(out, k)
			}
		}
	}
	slices.Sort(out)
	return out
}

func (c counts) String() string {
	var parts []string
	for _, k := range sortedKeys(c) {
		if c[k] != 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", k, c[k]))
		}
	}
	if len(parts) == 0 {
		return "no GPU resources"
	}
	return strings.Join(parts, ", ")
}

// checkTimeSlicing checks a node whose GPUs are time-sliced but not MIG-partitioned:
// nvidia.com/gpu (or nvidia.com/gpu.shared when renamed) must be GPUs × replicas.
func checkTimeSlicing(nd node, n int) string {
	gpus, ok := nd.intLabel(names.GPUCountLabel)
	if !ok {
		return fmt.Sprintf("label %s=%d but no readable %s label (GPU feature discovery writes it), so the shared count cannot be checked", names.GPUReplicasLabel, n, names.GPUCountLabel)
	}
	adv := nd.advertised()
	renamed := nd.renamed(adv)
	want := counts{names.GPUResource: int64(gpus)}.shared(n, renamed)
	// MIG resources are another layout's business: only the whole-GPU names are compared.
	for res := range adv {
		if strings.HasPrefix(res, names.MIGResourcePrefix) {
			delete(adv, res)
		}
	}
	d := diff(want, adv)
	if len(d) == 0 {
		return ""
	}
	how := "not renamed"
	if renamed {
		how = "renamed (" + names.SharedGPUResource + ")"
	}
	return fmt.Sprintf("time-slicing %s=%d on %d GPUs (%s), %s: %s; the device plugin's sharing config and GFD's labels disagree, restart both on the node",
		names.GPUReplicasLabel, n, gpus, names.GPUCountLabel, how, strings.Join(d, "; "))
}

// migState checks mig-manager's report. inFlux is true while the layout is being changed or
// failed to change: the node's resources then say nothing about the config.
func (c *checker) migState(nd node) (reason string, inFlux bool) {
	state, ok := nd.Metadata.Labels[names.MIGConfigStateLabel]
	if !ok {
		return "", false
	}
	cfg := nd.Metadata.Labels[names.MIGConfigLabel]
	switch state {
	case names.MIGStateSuccess:
		return "", false
	case names.MIGStateFailed:
		return fmt.Sprintf("label %s=%s: mig-manager could not apply %s=%s; its log on this node (the nvidia-mig-manager pod) says why", names.MIGConfigStateLabel, state, names.MIGConfigLabel, cfg), true
	case names.MIGStatePending, names.MIGStateRebooting:
	default:
		return fmt.Sprintf("label %s=%q is not a state mig-manager writes (%s, %s, %s or %s)", names.MIGConfigStateLabel, state,
			names.MIGStateSuccess, names.MIGStatePending, names.MIGStateRebooting, names.MIGStateFailed), true
	}
	since, ok := nd.stateSince()
	if !ok {
		if c.opts.PendingWithoutTime == PendingMismatch {
			return fmt.Sprintf("label %s=%s and the dump does not tell since when (no managedFields entry owns the label: dump with kubectl get nodes -o json --show-managed-fields); --mig-pending-no-timestamp=mismatch counts that as a mismatch",
				names.MIGConfigStateLabel, state), true
		}
		return "", true
	}
	age := c.now.Sub(since).Truncate(time.Second)
	if c.opts.PendingTimeout > 0 && age > c.opts.PendingTimeout {
		return fmt.Sprintf("label %s=%s for %s (last written %s), longer than --mig-pending-timeout %s: mig-manager is stuck applying %s=%s; see its log on this node",
			names.MIGConfigStateLabel, state, age, since.UTC().Format(time.RFC3339), c.opts.PendingTimeout, names.MIGConfigLabel, cfg), true
	}
	return "", true
}

// stateSince is when the writer of nvidia.com/mig.config.state last wrote the node, from the
// node's managedFields: the API server stamps each field manager's entry with the time of its
// last write, and the entry that owns the label is mig-manager's. A later write by mig-manager
// to another field moves the stamp forward, so the age read from it is never longer than the
// time the state has really held: a pending state is never called stuck too early.
func (nd node) stateSince() (time.Time, bool) {
	var latest time.Time
	for _, mf := range nd.Metadata.ManagedFields {
		md, _ := mf.FieldsV1["f:metadata"].(map[string]any)
		labels, _ := md["f:labels"].(map[string]any)
		if _, owns := labels["f:"+names.MIGConfigStateLabel]; !owns {
			continue
		}
		t, err := time.Parse(time.RFC3339, mf.Time)
		if err == nil && t.After(latest) {
			latest = t
		}
	}
	return latest, !latest.IsZero()
}

package dra

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/version"
)

// BlocksMinVersion is the first Kubernetes release whose scheduler can run blocks at scale.
// Before it (kubernetes#138917, merged for 1.37), the allocator treats every slice with
// shared counters as relevant to every node: each per-node Allocate gathers a partial pool for
// every other node's counter slice and checks it, O(N) conversions per filtered node and
// O(N²) per pod, which upstream measured at about 3 pods/s against about 100 without
// partitionable devices. The chart refuses dra.blocks below it too.
var BlocksMinVersion = version.MajorMinor(1, 37)

// ReasonBlocksRefused is the Event reason when the driver will not publish blocks.
const ReasonBlocksRefused = "DRABlocksRefused"

// blocksRefusal says why blocks must stay off for an apiserver of gitVersion ("" when they
// may be published). The apiserver's version stands for the scheduler's: the version skew
// policy lets the scheduler be older, never newer, so a 1.37 apiserver during a control-plane
// upgrade may still front a 1.36 scheduler for the upgrade's duration. A version that does not
// parse (a development build) is not judged.
func blocksRefusal(gitVersion string) string {
	v, err := version.ParseGeneric(gitVersion)
	if err != nil || v.Major() == 0 || v.AtLeast(BlocksMinVersion) {
		return ""
	}
	return fmt.Sprintf("dra.blocks is on, but the apiserver is Kubernetes %s: before %d.%d the scheduler's allocator rescans every node's shared counters for each node it filters (kubernetes#138917), so blocks cost O(N²) per pod; the driver publishes the GPUs without blocks (TP claims still take k GPUs of one domain). Upgrade the control plane to %d.%d or later, or set dra.blocks=false",
		gitVersion, BlocksMinVersion.Major(), BlocksMinVersion.Minor(), BlocksMinVersion.Major(), BlocksMinVersion.Minor())
}

// versionTimeout bounds the apiserver version read (discovery takes no context).
const versionTimeout = 10 * time.Second

// checkAllocator decides, once, whether blocks may be published: not below BlocksMinVersion
// (a Warning Event on the Node says why). Until the apiserver has told its version (down at
// the driver's start, say) no blocks are published, and housekeeping asks again each round;
// it reports whether the decision changed what to publish. The chart refuses dra.blocks
// below that version too, but a `helm template` without --kube-version (Helm 4 assumes the
// newest release) or a downgraded control plane gets past it.
func (d *Driver) checkAllocator(ctx context.Context) bool {
	d.mu.Lock()
	decided := d.allocatorChecked
	d.mu.Unlock()
	if !d.o.Blocks || d.o.Client == nil || decided {
		return false
	}
	type answer struct {
		v   string
		err error
	}
	got := make(chan answer, 1)
	go func() {
		info, err := d.o.Client.Discovery().ServerVersion()
		if err != nil {
			got <- answer{err: err}
			return
		}
		got <- answer{v: info.GitVersion}
	}()
	var a answer
	select {
	case a = <-got:
	case <-time.After(versionTimeout):
		a.err = fmt.Errorf("no answer within %s", versionTimeout)
	case <-ctx.Done():
		a.err = ctx.Err()
	}
	if a.err != nil {
		d.o.Log.Error(a.err, "read the apiserver's version; no blocks are published until it answers")
		return false
	}
	why := blocksRefusal(a.v)
	d.mu.Lock()
	d.allocatorChecked, d.noBlocks = true, d.noBlocks || why != ""
	d.mu.Unlock()
	if why == "" {
		return true
	}
	d.o.Log.Info(why)
	d.event(ctx, corev1.EventTypeWarning, ReasonBlocksRefused, why)
	return false
}

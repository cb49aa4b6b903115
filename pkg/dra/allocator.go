package dra

import (
	"context"
	"fmt"

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

// checkAllocator turns blocks off, with a Warning Event on the Node, when the apiserver is
// older than BlocksMinVersion. An apiserver that cannot be asked now leaves blocks as
// configured: the chart refused the values below that version already.
func (d *Driver) checkAllocator(ctx context.Context) {
	if !d.o.Blocks || d.o.Client == nil {
		return
	}
	info, err := d.o.Client.Discovery().ServerVersion()
	if err != nil {
		d.o.Log.Error(err, "read the apiserver's version; blocks stay as configured")
		return
	}
	why := blocksRefusal(info.GitVersion)
	if why == "" {
		return
	}
	d.mu.Lock()
	d.noBlocks = true
	d.mu.Unlock()
	d.o.Log.Info(why)
	d.event(ctx, corev1.EventTypeWarning, ReasonBlocksRefused, why)
}

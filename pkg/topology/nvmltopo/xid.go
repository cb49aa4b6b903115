package nvmltopo

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/go-logr/logr"
)

// DefaultIgnoredXIDs are the XIDs an application causes and survives (NVIDIA's device plugin
// skips the same ones): 13 graphics engine exception, 31 GPU memory page fault, 43 GPU stopped
// processing, 45 preemptive cleanup, 68 NVDEC exception, 109 context switch timeout. A CUDA
// program with a bad pointer raises 31; marking the GPU for that would let any tenant take
// GPUs out of service.
var DefaultIgnoredXIDs = []uint64{13, 31, 43, 45, 68, 109}

// xidMeaning names the XIDs operators meet most on HGX nodes, for the mark's text; the rest
// are looked up in NVIDIA's XID catalog.
var xidMeaning = map[uint64]string{
	48:  "double-bit ECC error",
	74:  "NVLink error",
	79:  "the GPU has fallen off the bus",
	94:  "contained ECC error",
	95:  "uncontained ECC error",
	119: "GSP RPC timeout",
	120: "GSP error",
}

// XIDs watches NVML's critical-error events (XIDs) and marks the GPUs they name unhealthy.
// Health (discover.go) reads state the driver keeps until a reset; an XID is an event, seen
// once, so the watcher remembers it: a GPU that raised one stays marked for the life of the
// process, as NVIDIA's device plugin keeps it, since NVML offers no reliable way to tell
// that the GPU was reset since. Clearing a mark is therefore an operator's act: reset the
// GPU, then restart the node pod. Discovery adds the marks to topology.GPU.Unhealthy
// (Options.Marks); Changes signals a new mark so the agent publishes it at once rather than a
// period later.
type XIDs struct {
	lib     nvml.Interface
	ignored map[uint64]bool
	log     logr.Logger
	now     func() time.Time

	mu    sync.Mutex
	marks map[string]*xidMark // by GPU UUID; allGPUs for a GPU NVML could not name
	// changed has room for one signal: a mark made while one is pending is published by
	// the same reload.
	changed chan struct{}
}

// allGPUs keys a mark that holds for every GPU: an event NVML could not attribute (a GPU lost
// from the bus, an event for a handle it no longer resolves). Failing closed there takes the
// node's GPUs out of new placements, which is what a lost GPU does to a TP job anyway.
const allGPUs = "*"

type xidMark struct {
	first time.Time
	codes []string // distinct, in the order seen
}

// NewXIDs returns a watcher over lib that ignores the given XIDs (DefaultIgnoredXIDs when
// nil). Run starts it.
func NewXIDs(lib nvml.Interface, ignored []uint64, log logr.Logger) *XIDs {
	if ignored == nil {
		ignored = DefaultIgnoredXIDs
	}
	x := &XIDs{lib: lib, ignored: map[uint64]bool{}, log: log, now: time.Now, marks: map[string]*xidMark{}, changed: make(chan struct{}, 1)}
	for _, id := range ignored {
		x.ignored[id] = true
	}
	return x
}

// Changes receives after a new mark.
func (x *XIDs) Changes() <-chan struct{} { return x.changed }

// Mark says why the GPU with this UUID is marked ("" when it is not).
func (x *XIDs) Mark(uuid string) string {
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []string
	for _, key := range []string{uuid, allGPUs} {
		if m := x.marks[key]; m != nil {
			out = append(out, fmt.Sprintf("%s since %s: reset the GPU (`nvidia-smi -r -i <index>`, or reboot the node), then restart the nvdomain node pod to clear the mark",
				strings.Join(m.codes, ", "), m.first.UTC().Format(time.RFC3339)))
		}
	}
	return strings.Join(out, "; ")
}

// eventMask is what the watcher registers: critical XIDs only. A double-bit ECC error comes
// as XID 48 too, and the ECC state discovery reads (health) covers the rest.
const eventMask = uint64(nvml.EventTypeXidCriticalError)

// waitMillis bounds one wait on the event set, so that ctx's end is noticed.
const waitMillis = 1000

// Run registers every GPU's critical-error events and records them until ctx ends. It returns
// an error when NVML or its event set cannot be set up (discovery still works without it); a
// GPU that does not support the events is left out with a log line.
func (x *XIDs) Run(ctx context.Context) error {
	if ret := x.lib.Init(); ret != nvml.SUCCESS {
		return fmt.Errorf("NVML for the XID watcher: %w", initError(ret))
	}
	defer x.lib.Shutdown()
	set, ret := x.lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("NVML: create an event set for XIDs: %v", ret)
	}
	defer set.Free()
	count, ret := x.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("NVML: count GPUs for the XID watcher: %v", ret)
	}
	byHandle := map[nvml.Device]string{}
	watched := 0
	for i := range count {
		dev, ret := x.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("NVML: open GPU %d for the XID watcher: %v", i, ret)
		}
		uuid, ret := dev.GetUUID()
		if ret != nvml.SUCCESS {
			return fmt.Errorf("NVML: GPU %d's UUID for the XID watcher: %v", i, ret)
		}
		byHandle[dev] = uuid
		supported, ret := dev.GetSupportedEventTypes()
		if ret != nvml.SUCCESS || supported&eventMask == 0 {
			x.log.Info("GPU does not report XID events; only its health state is checked", "gpu", i, "nvml", ret)
			continue
		}
		if ret := dev.RegisterEvents(eventMask, set); ret != nvml.SUCCESS {
			x.log.Info("could not register for the GPU's XID events; only its health state is checked", "gpu", i, "nvml", ret)
			continue
		}
		watched++
	}
	x.log.Info("watching XID events", "gpus", watched, "ignored", slices.Sorted(maps.Keys(x.ignored)))
	for ctx.Err() == nil {
		e, ret := set.Wait(waitMillis)
		switch ret {
		case nvml.SUCCESS:
			x.record(e, byHandle)
		case nvml.ERROR_TIMEOUT:
		case nvml.ERROR_GPU_IS_LOST:
			x.mark(allGPUs, "a GPU fell off the bus (NVML: GPU is lost)")
		default:
			// Not an event: say so and back off, rather than spin or mark GPUs for a
			// failing call.
			x.log.Info("waiting for XID events failed; retrying", "nvml", ret)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
	return nil
}

// record marks the GPU an event names, unless the event is not a critical XID or its XID is
// ignored.
func (x *XIDs) record(e nvml.EventData, byHandle map[nvml.Device]string) {
	if e.EventType&eventMask == 0 || x.ignored[e.EventData] {
		return
	}
	code := "XID " + strconv.FormatUint(e.EventData, 10)
	if m := xidMeaning[e.EventData]; m != "" {
		code += " (" + m + ")"
	}
	uuid, ok := byHandle[e.Device]
	if !ok && e.Device != nil {
		if u, ret := e.Device.GetUUID(); ret == nvml.SUCCESS {
			uuid, ok = u, true
		}
	}
	if !ok {
		uuid = allGPUs
	}
	x.mark(uuid, code)
}

// mark records code against key; a code already recorded there changes nothing (no new
// signal, the mark's text stays), so a GPU that repeats an XID does not republish each time.
func (x *XIDs) mark(key, code string) {
	x.mu.Lock()
	m := x.marks[key]
	if m == nil {
		m = &xidMark{first: x.now()}
		x.marks[key] = m
	}
	if slices.Contains(m.codes, code) {
		x.mu.Unlock()
		return
	}
	m.codes = append(m.codes, code)
	x.mu.Unlock()
	gpu := key
	if key == allGPUs {
		gpu = "all (the event named no GPU NVML knows)"
	}
	x.log.Info("a GPU raised a critical XID: marking it unhealthy until the node pod restarts", "gpu", gpu, "xid", code)
	select {
	case x.changed <- struct{}{}:
	default:
	}
}

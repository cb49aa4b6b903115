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

	"github.com/nvdomain/nvdomain/pkg/topology"
)

// DefaultIgnoredXIDs are the XIDs that mark nothing. An application causes and survives these
// (NVIDIA's device plugin skips the same ones): 13 graphics engine exception, 31 GPU memory
// page fault, 43 GPU stopped processing, 45 preemptive cleanup, 68 NVDEC exception, 109
// context switch timeout; a CUDA program with a bad pointer raises 31, and marking the GPU for
// it would let any tenant take GPUs out of service. And these report memory events that the
// GPU's state already carries and discovery's health only warns of (a pending remap or page
// retirement, ECC errors since the last reset): 63 a row remap or page retirement recorded,
// 92 a high single-bit ECC rate, 94 a contained ECC error (the application that hit it is
// stopped; the GPU goes on). A failed remap (64) marks, as the failed remap state does.
var DefaultIgnoredXIDs = []uint64{13, 31, 43, 45, 63, 68, 92, 94, 109}

// xidMeaning names the XIDs operators meet most on HGX nodes, for the mark's text; the rest
// are looked up in NVIDIA's XID catalog.
var xidMeaning = map[uint64]string{
	48:  "double-bit ECC error",
	74:  "NVLink error",
	79:  "the GPU has fallen off the bus",
	95:  "uncontained ECC error",
	119: "GSP RPC timeout",
	120: "GSP error",
}

// XIDs watches NVML's critical-error events (XIDs) and marks the GPUs they name unhealthy.
// Health (discover.go) reads state the driver keeps until a reset; an XID is an event, seen
// once, so the watcher remembers it: a GPU that raised one stays marked for the life of the
// process, as NVIDIA's device plugin keeps it, since NVML offers no reliable way to tell
// that the GPU was reset since. Clearing a mark is therefore an operator's act: a reboot (or
// a restart of the node pod). Discovery adds the marks to topology.GPU.Unhealthy
// (Options.Marks), and Overlay to a topology kept from before a discovery that fails (a GPU
// off the bus fails it); Changes signals a new mark so the agent publishes it at once rather
// than a period later.
//
// The watcher holds NVML open for as long as it runs, as NVIDIA's device plugin and DCGM do:
// an in-place GPU reset, or unloading the kernel module for a driver upgrade, needs the node
// pod gone first. That is why it is off unless asked for (the agent's --nvml-xids). A MIG
// GPU's events come for the whole GPU (the agent is not privileged), so an XID in one
// instance marks the GPU.
type XIDs struct {
	lib     nvml.Interface
	ignored map[uint64]bool
	log     logr.Logger
	now     func() time.Time
	retry   time.Duration // retryPeriod; shorter in tests

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

// Overlay returns top with the marks added to its GPUs' Unhealthy (top itself when no GPU
// gains one): for a topology kept while discovery fails. A mark a GPU already carries is not
// added again, so overlaying a kept topology on every failing round changes nothing.
func (x *XIDs) Overlay(top *topology.Topology) *topology.Topology {
	if top == nil {
		return nil
	}
	var out *topology.Topology
	for i, g := range top.GPUs {
		m := x.Mark(g.UUID)
		if m == "" || strings.Contains(g.Unhealthy, m) {
			continue
		}
		if out == nil {
			c := *top
			c.GPUs = slices.Clone(top.GPUs)
			out = &c
		}
		out.GPUs[i].Unhealthy = strings.Join(appendIf(appendIf(nil, g.Unhealthy), m), "; ")
	}
	if out == nil {
		return top
	}
	return out
}

// NewXIDs returns a watcher over lib that ignores the given XIDs (DefaultIgnoredXIDs when
// nil). Run starts it.
func NewXIDs(lib nvml.Interface, ignored []uint64, log logr.Logger) *XIDs {
	if ignored == nil {
		ignored = DefaultIgnoredXIDs
	}
	x := &XIDs{lib: lib, ignored: map[uint64]bool{}, log: log, now: time.Now, retry: retryPeriod, marks: map[string]*xidMark{}, changed: make(chan struct{}, 1)}
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
			out = append(out, fmt.Sprintf("%s since %s: drain the node and reboot it, which clears the mark (an in-place `nvidia-smi -r` needs every process off the GPU, this node's nvdomain agent included, which holds NVML open to watch XIDs)",
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

// Run watches until ctx ends. A watch that cannot be set up (NVML not loaded yet: the GPU
// Operator's driver container comes up after the node pods) is tried again every
// retryPeriod, so XIDs are watched once the driver is there; each distinct failure is logged
// once.
func (x *XIDs) Run(ctx context.Context) {
	last := ""
	for ctx.Err() == nil {
		err := x.watch(ctx)
		if err == nil {
			return
		}
		if err.Error() != last {
			last = err.Error()
			x.log.Error(err, "the XID watcher could not start; GPUs are judged by their NVML health state alone until it can", "retry", x.retry)
		}
		select {
		case <-ctx.Done():
		case <-time.After(x.retry):
		}
	}
}

// retryPeriod is how often a watch that could not be set up is tried again.
const retryPeriod = 30 * time.Second

// watch registers every GPU's critical-error events and records them until ctx ends (nil). It
// returns an error when NVML or its event set cannot be set up; a GPU that cannot be opened
// or does not report the events is left out with a log line, the others are watched.
func (x *XIDs) watch(ctx context.Context) error {
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
			x.log.Info("could not open the GPU for the XID watcher; only its health state is checked", "gpu", i, "nvml", ret)
			continue
		}
		uuid, ret := dev.GetUUID()
		if ret != nvml.SUCCESS {
			x.log.Info("could not read the GPU's UUID for the XID watcher; only its health state is checked", "gpu", i, "nvml", ret)
			continue
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
	failing := nvml.SUCCESS
	for ctx.Err() == nil {
		e, ret := set.Wait(waitMillis)
		switch ret {
		case nvml.SUCCESS:
			x.record(e, byHandle)
		case nvml.ERROR_TIMEOUT:
		default:
			if ret == nvml.ERROR_GPU_IS_LOST {
				x.lost(byHandle, "a GPU fell off the bus (NVML: GPU is lost)")
			}
			// Not an event: back off rather than spin (a lost GPU answers at once, every
			// time), and say so once per kind of failure.
			if ret != failing {
				failing = ret
				x.log.Info("waiting for XID events failed; retrying every second", "nvml", ret)
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		failing = nvml.SUCCESS
	}
	return nil
}

// lost marks the GPUs that no longer answer (GetUUID says GPU is lost) with why, or every GPU
// when none can be told apart: an event NVML cannot attribute takes the node's GPUs out of
// new placements (fail closed), which is what a lost GPU does to a TP job anyway.
func (x *XIDs) lost(byHandle map[nvml.Device]string, why string) {
	found := false
	for dev, uuid := range byHandle {
		if _, ret := dev.GetUUID(); ret == nvml.ERROR_GPU_IS_LOST {
			x.mark(uuid, why)
			found = true
		}
	}
	if !found {
		x.mark(allGPUs, why)
	}
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
		x.lost(byHandle, code)
		return
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

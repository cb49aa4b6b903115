package nvmltopo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
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
// xidFallenOffTheBus is the XID the driver raises for a GPU lost from the bus; it marks the
// GPU lost (the gpu-lost device taint) as NVML's "GPU is lost" does.
const xidFallenOffTheBus = 79

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
// once, so the watcher remembers it: a GPU that raised one stays marked until the node
// reboots, since NVML offers no reliable way to tell that the GPU was reset since. With a
// marks file (Persist) the marks outlive the process too: a DaemonSet rollout or an agent
// crash would otherwise make a GPU with a double-bit ECC error placeable again (review DRA
// 5a). The file is keyed by the kernel's boot id, so a reboot clears it; clearing a mark
// without one is an operator's act (delete the file, restart the node pod). Discovery adds
// the marks to topology.GPU (Options.Marks), and Overlay to a topology kept from before a
// discovery that fails (a GPU off the bus fails it); Changes signals a new mark so the agent
// publishes it at once rather than a period later.
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
	// reinitAfter is how many failed waits in a row make the watcher start NVML anew
	// (reinitAfter); fewer in tests.
	reinitAfter int

	mu    sync.Mutex
	marks map[string]*xidMark // by GPU UUID; allGPUs for a GPU NVML could not name
	// file and bootID: where the marks are kept across restarts, and the boot they hold for
	// (Persist); file is empty when they live in memory only.
	file, bootID string
	// dirty says the last save failed; the watch loop tries again each wait.
	dirty bool
	// changed has room for one signal: a mark made while one is pending is published by
	// the same reload.
	changed chan struct{}
}

// allGPUs keys a mark that holds for every GPU: an event NVML could not attribute (a GPU lost
// from the bus, an event for a handle it no longer resolves). Failing closed there takes the
// node's GPUs out of new placements, which is what a lost GPU does to a TP job anyway.
const allGPUs = "*"

type xidMark struct {
	First time.Time `json:"first"`
	Codes []string  `json:"codes"` // distinct, in the order seen
	// XIDs are the critical XIDs among Codes, in the order seen; Lost says NVML answered
	// "GPU is lost". The DRA driver names its device taints after them.
	XIDs []uint64 `json:"xids,omitempty"`
	Lost bool     `json:"lost,omitempty"`
}

// Mark is what the watcher knows against one GPU: Text for its Unhealthy reason (empty when
// unmarked), the critical XIDs it raised and whether NVML lost it.
type Mark struct {
	Text string
	XIDs []uint64
	Lost bool
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
		m := x.Problem(g.UUID)
		if m.Text == "" || strings.Contains(g.Unhealthy, m.Text) {
			continue
		}
		if out == nil {
			c := *top
			c.GPUs = slices.Clone(top.GPUs)
			out = &c
		}
		m.Apply(&out.GPUs[i])
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
	x := &XIDs{lib: lib, ignored: map[uint64]bool{}, log: log, now: time.Now, retry: retryPeriod, reinitAfter: reinitAfter, marks: map[string]*xidMark{}, changed: make(chan struct{}, 1)}
	for _, id := range ignored {
		x.ignored[id] = true
	}
	return x
}

// Changes receives after a new mark.
func (x *XIDs) Changes() <-chan struct{} { return x.changed }

// Mark says why the GPU with this UUID is marked ("" when it is not).
func (x *XIDs) Mark(uuid string) string { return x.Problem(uuid).Text }

// Problem is the mark against the GPU with this UUID, a mark for every GPU included (the
// zero Mark when there is none).
func (x *XIDs) Problem(uuid string) Mark {
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []string
	var p Mark
	for _, key := range []string{uuid, allGPUs} {
		if m := x.marks[key]; m != nil {
			out = append(out, fmt.Sprintf("%s since %s: drain the node and reboot it, which clears the mark (an in-place `nvidia-smi -r` needs every process off the GPU, this node's nvdomain agent included, which holds NVML open to watch XIDs; with a marks file, delete it before the pod restarts)",
				strings.Join(m.Codes, ", "), m.First.UTC().Format(time.RFC3339)))
			for _, id := range m.XIDs {
				if !slices.Contains(p.XIDs, id) {
					p.XIDs = append(p.XIDs, id)
				}
			}
			p.Lost = p.Lost || m.Lost
		}
	}
	p.Text = strings.Join(out, "; ")
	return p
}

// Apply adds the mark to g: its text to Unhealthy, its XIDs and loss to the fields the DRA
// driver names taints after. A zero Mark changes nothing.
func (m Mark) Apply(g *topology.GPU) {
	if m.Text == "" {
		return
	}
	g.Unhealthy = strings.Join(appendIf(appendIf(nil, g.Unhealthy), m.Text), "; ")
	for _, id := range m.XIDs {
		if !slices.Contains(g.XIDs, id) {
			g.XIDs = append(g.XIDs, id)
		}
	}
	g.Lost = g.Lost || m.Lost
}

// marksFile is the marks file's content.
type marksFile struct {
	// BootID is /proc/sys/kernel/random/boot_id when the marks were written: marks of
	// another boot are dropped, as a reboot resets the GPUs.
	BootID string              `json:"bootID"`
	Marks  map[string]*xidMark `json:"marks"`
}

// BootIDFile is where Linux tells the current boot's id; it is the host's in a container too
// (procfs does not namespace it).
const BootIDFile = "/proc/sys/kernel/random/boot_id"

// Persist keeps the marks in path from now on, and restores those it holds for bootID (the
// content of BootIDFile). A file from another boot is removed. One that cannot be parsed is
// moved aside (<path>.corrupt, for whoever looks into it) and reported in the error, and the
// watcher goes on keeping its marks there: a broken file must not turn persistence off for
// every later start. One that cannot be read at all is an error, and the marks then live in
// memory only. Call it before Run.
func (x *XIDs) Persist(path, bootID string) error {
	bootID = strings.TrimSpace(bootID)
	if bootID == "" {
		return fmt.Errorf("XID marks file %s: no boot id to key it by (read %s)", path, BootIDFile)
	}
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fmt.Errorf("read the XID marks file: %w", err)
	default:
		var f marksFile
		if err := json.Unmarshal(data, &f); err != nil {
			aside := path + ".corrupt"
			if rerr := os.Rename(path, aside); rerr != nil {
				return fmt.Errorf("XID marks file %s is not valid (%v) and cannot be moved aside (%v): delete it to start without the marks it held", path, err, rerr)
			}
			x.mu.Lock()
			x.file, x.bootID = path, bootID
			x.mu.Unlock()
			return fmt.Errorf("XID marks file %s was not valid (%v): moved to %s; marks are kept anew from now on, and a GPU marked before is unmarked until it raises an XID again", path, err, aside)
		}
		if f.BootID != bootID {
			x.log.Info("the XID marks file is from an earlier boot, which reset the GPUs: its marks are cleared", "file", path, "marks", len(f.Marks))
			if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("remove the XID marks of an earlier boot: %w", err)
			}
			break
		}
		x.mu.Lock()
		for key, m := range f.Marks {
			if m != nil && len(m.Codes) > 0 {
				x.marks[key] = m
			}
		}
		x.mu.Unlock()
		if len(f.Marks) > 0 {
			x.log.Info("XID marks restored from this boot", "file", path, "gpus", slices.Sorted(maps.Keys(f.Marks)))
		}
	}
	x.mu.Lock()
	x.file, x.bootID = path, bootID
	x.mu.Unlock()
	return nil
}

// save writes the marks to the marks file, atomically (a crash leaves the old file or the
// new, never half); x.mu is held. A write that fails is logged: the mark still holds in
// memory and reaches the node, and only a restart before the next good write would lose it.
func (x *XIDs) save() {
	if x.file == "" {
		return
	}
	data, err := json.Marshal(marksFile{BootID: x.bootID, Marks: x.marks})
	if err == nil {
		err = writeAtomic(x.file, data)
	}
	if err != nil {
		if !x.dirty {
			x.log.Error(err, "could not keep the XID marks across restarts; they hold in memory, and the write is tried again every second", "file", x.file)
		}
		x.dirty = true
		return
	}
	if x.dirty {
		x.log.Info("the XID marks are kept across restarts again", "file", x.file)
	}
	x.dirty = false
}

// retrySave writes the marks again after a save failed (a full or read-only disk), so that a
// restart once the disk is back does not lose them.
func (x *XIDs) retrySave() {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.dirty {
		x.save()
	}
}

func writeAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write the XID marks file: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write the XID marks file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("sync the XID marks file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write the XID marks file: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("replace the XID marks file: %w", err)
	}
	return nil
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

// reinitAfter is how many failed waits in a row (a second apart) end a watch, so that Run
// starts NVML and the event set anew: a wait that keeps failing with something other than a
// timeout is a dead event set (a driver that recovered underneath, a handle NVML dropped),
// and waiting on it for ever would watch nothing (review DRA 5b).
const reinitAfter = 30

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
	failing, failures := nvml.SUCCESS, 0
	for ctx.Err() == nil {
		x.retrySave()
		e, ret := set.Wait(waitMillis)
		switch ret {
		case nvml.SUCCESS:
			x.record(e, byHandle)
		case nvml.ERROR_TIMEOUT:
		default:
			if ret == nvml.ERROR_GPU_IS_LOST {
				x.lost(byHandle, "a GPU fell off the bus (NVML: GPU is lost)", 0)
			}
			// Not an event: back off rather than spin (a lost GPU answers at once, every
			// time), and say so once per kind of failure.
			if ret != failing {
				failing = ret
				x.log.Info("waiting for XID events failed; retrying every second", "nvml", ret)
			}
			if failures++; failures >= x.reinitAfter {
				return fmt.Errorf("waiting for XID events failed %d times in a row (NVML: %v): starting NVML anew", failures, ret)
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		failing, failures = nvml.SUCCESS, 0
	}
	return nil
}

// lost marks the GPUs that no longer answer (GetUUID says GPU is lost) with why, or every GPU
// when none can be told apart: an event NVML cannot attribute takes the node's GPUs out of
// new placements (fail closed), which is what a lost GPU does to a TP job anyway.
func (x *XIDs) lost(byHandle map[nvml.Device]string, why string, xid uint64) {
	found := false
	for dev, uuid := range byHandle {
		if _, ret := dev.GetUUID(); ret == nvml.ERROR_GPU_IS_LOST {
			x.mark(uuid, why, xid, true)
			found = true
		}
	}
	if !found {
		// Lost only when NVML said so; an XID it could not attribute is that XID's mark.
		x.mark(allGPUs, why, xid, xid == 0)
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
		x.lost(byHandle, code, e.EventData)
		return
	}
	// XID 79 is the driver's own word that the GPU fell off the bus.
	x.mark(uuid, code, e.EventData, e.EventData == xidFallenOffTheBus)
}

// mark records code against key, with its XID (0: none) and whether NVML lost the GPU; a
// code already recorded there changes nothing (no new signal, the mark's text stays), so a
// GPU that repeats an XID does not republish each time. A new mark is saved to the marks file
// before it is signalled.
func (x *XIDs) mark(key, code string, xid uint64, lost bool) {
	x.mu.Lock()
	m := x.marks[key]
	if m == nil {
		m = &xidMark{First: x.now()}
		x.marks[key] = m
	}
	if slices.Contains(m.Codes, code) {
		x.mu.Unlock()
		return
	}
	m.Codes = append(m.Codes, code)
	if xid != 0 && !slices.Contains(m.XIDs, xid) {
		m.XIDs = append(m.XIDs, xid)
	}
	m.Lost = m.Lost || lost
	x.save()
	x.mu.Unlock()
	gpu := key
	if key == allGPUs {
		gpu = "all (the event named no GPU NVML knows)"
	}
	x.log.Info("a GPU raised a critical XID: marking it unhealthy until the node reboots", "gpu", gpu, "xid", code)
	select {
	case x.changed <- struct{}{}:
	default:
	}
}

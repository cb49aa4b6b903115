package nriplugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/nvdomain/nvdomain/pkg/kubeevents"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/nristate"
)

// StateFile writes the nristate file, coalescing bursts: Changed only records the
// latest state and wakes a writer goroutine, so container creation never waits on disk.
type StateFile struct {
	path string
	log  logr.Logger
	// onDrained runs once, before the first write that says the uninstall is drained on this
	// node (pass-through, synchronized, no pod requiring the plugin): the agent reads that
	// file and then lets the DaemonSets go, so what must leave the host goes first.
	onDrained func()
	drained   bool

	mu      sync.Mutex
	latest  Snapshot
	pending bool
	wake    chan struct{}
}

// NewStateFile starts the writer; it stops when ctx ends, after a final write. onDrained
// (nil: nothing) runs before the file first says the node's uninstall is drained.
func NewStateFile(ctx context.Context, path string, log logr.Logger, onDrained func()) *StateFile {
	s := &StateFile{path: path, log: log, wake: make(chan struct{}, 1), onDrained: onDrained}
	go s.loop(ctx)
	return s
}

// Assigned implements Reporter; the state file only cares about the whole picture.
func (s *StateFile) Assigned(Assignment, bool) {}

// Changed implements Reporter; an older snapshot than the one pending is ignored.
func (s *StateFile) Changed(snap Snapshot) {
	s.mu.Lock()
	if snap.Generation < s.latest.Generation {
		s.mu.Unlock()
		return
	}
	s.latest, s.pending = snap, true
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *StateFile) loop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			// The end of an uninstall (package lifecycle): the plugin is pass-through and no
			// pod needs it, so its state leaves the host with it.
			s.mu.Lock()
			gone := s.latest.PassThrough && s.latest.RequiringPods == 0
			s.mu.Unlock()
			if gone {
				if err := os.Remove(s.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
					s.log.Error(err, "remove the state file at the end of an uninstall", "path", s.path)
				}
				return
			}
			s.flush()
			return
		case <-s.wake:
			s.flush()
		}
	}
}

func (s *StateFile) flush() {
	s.mu.Lock()
	if !s.pending {
		s.mu.Unlock()
		return
	}
	latest := s.latest
	s.pending = false
	s.mu.Unlock()
	if latest.PassThrough && latest.Synchronized && latest.RequiringPods == 0 && !s.drained && s.onDrained != nil {
		s.drained = true // flush runs on the writer goroutine alone
		s.onDrained()
	}
	written, err := nristate.Write(s.path, nristate.Doc{Generation: latest.Generation, TopologyFingerprint: latest.Fingerprint, Assignments: latest.Assignments,
		PassThrough: latest.PassThrough, RequiringPods: latest.RequiringPods, Runtime: latest.Runtime, Synchronized: latest.Synchronized, Disconnected: latest.Disconnected})
	switch {
	case err != nil:
		s.log.Error(err, "write state file", "path", s.path)
	case !written:
		s.log.Info("state file holds a newer snapshot (another plugin process wrote it); not replaced", "path", s.path, "generation", latest.Generation)
	}
}

// Reporters fans events out to several reporters.
type Reporters []Reporter

// Assigned implements Reporter.
func (rs Reporters) Assigned(a Assignment, shouldHaveBeenPinned bool) {
	for _, r := range rs {
		r.Assigned(a, shouldHaveBeenPinned)
	}
}

// Changed implements Reporter.
func (rs Reporters) Changed(snap Snapshot) {
	for _, r := range rs {
		r.Changed(snap)
	}
}

// KubeReporter puts the assignment on the pod (the assigned-gpus annotation) and records an
// Event, from a worker goroutine with a bounded queue: API trouble delays or, at worst, drops
// a report; it never slows or fails a container creation.
type KubeReporter struct {
	client kubernetes.Interface
	names  names.Names
	node   string
	log    logr.Logger
	queue  chan report

	mu     sync.Mutex
	perPod map[string]map[string][]int // pod uid → container → GPUs, for the annotation
}

type report struct {
	a      Assignment
	unpin  bool
	perPod map[string][]int
}

// NewKubeReporter starts the worker; it stops when ctx ends.
func NewKubeReporter(ctx context.Context, client kubernetes.Interface, n names.Names, node string, log logr.Logger) *KubeReporter {
	r := &KubeReporter{client: client, names: n, node: node, log: log, queue: make(chan report, 1024), perPod: map[string]map[string][]int{}}
	go r.loop(ctx)
	return r
}

// Assigned implements Reporter.
func (r *KubeReporter) Assigned(a Assignment, shouldHaveBeenPinned bool) {
	r.mu.Lock()
	m := r.perPod[a.PodUID]
	if m == nil {
		m = map[string][]int{}
		r.perPod[a.PodUID] = m
	}
	m[a.ContainerName] = a.GPUs
	cp := make(map[string][]int, len(m))
	for k, v := range m {
		cp[k] = v
	}
	r.mu.Unlock()
	select {
	case r.queue <- report{a, shouldHaveBeenPinned, cp}:
	default:
		r.log.Info("report queue full; dropping the pod annotation and event", "pod", a.PodNamespace+"/"+a.PodName)
	}
}

// Changed implements Reporter: forget pods that no longer hold anything.
func (r *KubeReporter) Changed(snap Snapshot) {
	live := map[string]bool{}
	for _, a := range snap.Assignments {
		live[a.PodUID] = true
	}
	r.mu.Lock()
	for uid := range r.perPod {
		if !live[uid] {
			delete(r.perPod, uid)
		}
	}
	r.mu.Unlock()
}

func (r *KubeReporter) loop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case rep := <-r.queue:
			r.send(ctx, rep)
		}
	}
}

// AssignedValue renders the pod annotation: "4,5" for one GPU container, else a JSON object
// of container name to GPU list.
func AssignedValue(perContainer map[string][]int) string {
	if len(perContainer) == 1 {
		for _, g := range perContainer {
			return names.FormatGPUList(g)
		}
	}
	keys := make([]string, 0, len(perContainer))
	for k := range perContainer {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		kb, _ := json.Marshal(k)
		parts[i] = fmt.Sprintf("%s:%q", kb, names.FormatGPUList(perContainer[k]))
	}
	return "{" + strings.Join(parts, ",") + "}"
}

func (r *KubeReporter) send(ctx context.Context, rep report) {
	a := rep.a
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{r.names.PodAssignedGPUsAnnotation(): AssignedValue(rep.perPod)}}})
	backoff := 200 * time.Millisecond
	for attempt := 1; ; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := r.client.CoreV1().Pods(a.PodNamespace).Patch(cctx, a.PodName, types.MergePatchType, patch, metav1.PatchOptions{})
		cancel()
		if err == nil {
			break
		}
		if attempt == 5 || ctx.Err() != nil {
			r.log.Error(err, "annotate pod with its GPUs", "pod", a.PodNamespace+"/"+a.PodName)
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff *= 2
	}
	where := fmt.Sprintf("NVSwitch domain %d", a.Domain)
	if a.Domain < 0 {
		where = "no domain (pod not pinned)"
	}
	ev := kubeevents.Event{Object: kubeevents.PodRef(a.PodNamespace, a.PodName, a.PodUID), Type: corev1.EventTypeNormal, Reason: kubeevents.ReasonGPUsAssigned,
		Message: fmt.Sprintf("container %s got GPUs %s from %s", a.ContainerName, names.FormatGPUList(a.GPUs), where), Component: "nvdomain-nri", Host: r.node}
	if rep.unpin {
		ev.Reason, ev.Type = kubeevents.ReasonTensorParallelNotPinned, corev1.EventTypeWarning
		ev.Message = fmt.Sprintf("tensor-parallel container %s arrived without an NVSwitch domain (admitted while the nvdomain webhook was down?); it got GPUs %s, packed but not guaranteed to share a domain",
			a.ContainerName, names.FormatGPUList(a.GPUs))
	}
	if err := kubeevents.Record(ctx, r.client, ev); err != nil {
		r.log.Error(err, "record event")
	}
}

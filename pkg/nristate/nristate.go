// Package nristate is the contract between the NRI plugin and the node agent on one node: a
// JSON file listing every container that holds GPUs. The plugin writes it after each change;
// the agent reads it to lower the advertised capacity of a domain by the GPUs that unpinned
// containers hold there. A file on a shared hostPath is the channel because both run on the
// same node, it survives either side restarting, and it needs no API permission.
package nristate

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// DefaultPath is where both sides look unless told otherwise.
const DefaultPath = "/run/nvdomain/nri-state.json"

// Assignment is what one container holds.
type Assignment struct {
	ContainerID   string `json:"containerID"`
	PodSandboxID  string `json:"podSandboxID"`
	PodNamespace  string `json:"podNamespace"`
	PodName       string `json:"podName"`
	PodUID        string `json:"podUID"`
	ContainerName string `json:"containerName"`
	GPUs          []int  `json:"gpus"`
	// Domain is the pinned domain id, or -1 for a container whose pod has no domain.
	Domain int `json:"domain"`
}

// Doc is the file's content.
type Doc struct {
	Version int `json:"version"`
	// Generation orders snapshots: the plugin stamps each with the time it was taken, in
	// Unix nanoseconds, under the lock that guards its books. A writer never replaces a newer
	// snapshot with an older one, which can otherwise happen when a plugin that is shutting
	// down flushes after its replacement has written.
	Generation int64     `json:"generation"`
	Updated    time.Time `json:"updated"`
	// TopologyFingerprint is the plugin's topology.Fingerprint, so the agent can tell when
	// the two read different topologies.
	TopologyFingerprint string       `json:"topologyFingerprint,omitempty"`
	Assignments         []Assignment `json:"assignments"`
	// PassThrough: the release is being uninstalled and the plugin changes and refuses
	// nothing; RequiringPods counts the pods on the node that still require it (NRI's
	// required-plugins annotation). The agent deletes the kept DaemonSets once it is 0 on
	// every node (package lifecycle).
	PassThrough   bool `json:"passThrough,omitempty"`
	RequiringPods int  `json:"requiringPods,omitempty"`
	// Runtime is the runtime the plugin registered with, nil before its first registration.
	Runtime *Runtime `json:"runtime,omitempty"`
	// Synchronized: the plugin process that wrote the file has synchronized with the runtime
	// at least once, so RequiringPods counts the pods that run (before that it counts only
	// the creations it saw, none after a restart).
	Synchronized bool `json:"synchronized,omitempty"`
	// Disconnected: the plugin that wrote the file has lost its connection to the runtime
	// (containerd restarted, the plugin's stub closed) and not synchronized again. While it
	// is, containerd refuses every container that requires the plugin, so the agent offers
	// no room on the node (review classic M7). Absent in files of releases before it: those
	// count as connected.
	Disconnected bool `json:"disconnected,omitempty"`
}

// Runtime is a container runtime as the NRI plugin saw it at registration, and what it
// enforces: FailClosed when it validates adjustments (NRI v0.10, containerd 2.2, or later),
// so that a container whose required plugin is absent, slow or crashed is refused; Why says
// otherwise why not, with the fix.
type Runtime struct {
	Name       string `json:"name"`
	Version    string `json:"version"`
	NRIVersion string `json:"nriVersion,omitempty"`
	FailClosed bool   `json:"failClosed"`
	Why        string `json:"why,omitempty"`
}

// Write replaces the file atomically (a temporary file renamed over it), so a reader never
// sees half a document, unless the file already holds a newer generation; it reports whether
// it wrote. Writers serialise on a lock file beside it.
func Write(path string, doc Doc) (bool, error) {
	if doc.Assignments == nil {
		doc.Assignments = []Assignment{}
	}
	doc.Version = 1
	if doc.Updated.IsZero() {
		doc.Updated = time.Now().UTC()
	}
	data, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return false, err
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, fmt.Errorf("NRI state file: %w", err)
	}
	lock, err := os.OpenFile(path+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return false, fmt.Errorf("NRI state file lock: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return false, fmt.Errorf("NRI state file lock: %w", err)
	}
	defer func() { _ = syscall.Flock(int(lock.Fd()), syscall.LOCK_UN) }()
	if cur, err := Read(path); err == nil && cur.Generation > doc.Generation {
		return false, nil
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return false, fmt.Errorf("NRI state file: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return false, fmt.Errorf("NRI state file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return false, fmt.Errorf("NRI state file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return false, fmt.Errorf("NRI state file: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return false, fmt.Errorf("NRI state file: %w", err)
	}
	return true, nil
}

// Read reads the file.
func Read(path string) (*Doc, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read NRI state file: %w", err)
	}
	var doc Doc
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("NRI state file %s: %w", path, err)
	}
	return &doc, nil
}

// LastGeneration is the generation of the snapshot in the file, 0 when there is no file yet. A
// plugin that starts continues after it: stamping with the wall clock alone, its snapshots
// would be refused as older (Write) after the clock stepped back across its restart, until
// the clock caught up.
func LastGeneration(path string) (int64, error) {
	doc, err := Read(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return doc.Generation, nil
}

// UnpinnedByDomain sums, per domain id, the GPUs that containers without a domain hold.
// domainOf maps a GPU index to its domain id (false when the GPU is in none).
func UnpinnedByDomain(doc *Doc, domainOf func(gpu int) (int, bool)) map[int]int {
	out := map[int]int{}
	if doc == nil {
		return out
	}
	for _, a := range doc.Assignments {
		if a.Domain >= 0 {
			continue
		}
		for _, g := range a.GPUs {
			if d, ok := domainOf(g); ok {
				out[d]++
			}
		}
	}
	return out
}

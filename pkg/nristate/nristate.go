// Package nristate is the contract between the NRI plugin and the node agent on one node: a
// JSON file listing every container that holds GPUs. The plugin writes it after each change;
// the agent reads it to lower the advertised capacity of a domain by the GPUs that unpinned
// containers hold there. A file on a shared hostPath is the channel because both run on the
// same node, it survives either side restarting, and it needs no API permission.
package nristate

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
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
	Version     int          `json:"version"`
	Updated     time.Time    `json:"updated"`
	Assignments []Assignment `json:"assignments"`
}

// Write replaces the file atomically (a temporary file renamed over it), so a reader never sees
// half a document.
func Write(path string, assignments []Assignment) error {
	if assignments == nil {
		assignments = []Assignment{}
	}
	data, err := json.MarshalIndent(Doc{Version: 1, Updated: time.Now().UTC(), Assignments: assignments}, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("NRI state file: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("NRI state file: %w", err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("NRI state file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("NRI state file: %w", err)
	}
	return os.Rename(tmp.Name(), path)
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

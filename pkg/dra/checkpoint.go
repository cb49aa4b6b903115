package dra

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// The checkpoint's header. A file with another apiVersion or kind is refused, never guessed
// at: it was written by another version of the driver, or is not the driver's at all.
const (
	CheckpointAPIVersion = "gpu.nvdomain.io/v1"
	CheckpointKind       = "DRACheckpoint"
	// CheckpointFile is the checkpoint's name in the plugin's data directory.
	CheckpointFile = "checkpoint.json"
)

// Checkpoint is every claim the driver has prepared on this node. It lives in the plugin's
// data directory under the kubelet's root, so it survives the driver's and the node's
// restarts; the CDI specs, which may live on a tmpfs, are rebuilt from it.
type Checkpoint struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// Claims are keyed by claim UID.
	Claims map[types.UID]PreparedClaim `json:"claims"`
	// Unprepared are the claims unprepared in the last UnpreparedMemory, keyed by claim UID:
	// a Prepare the kubelet sends after a claim's Unprepare for the same pods (NVIDIA's driver
	// #1162) is refused by them, across the driver's restarts. Written by drivers since the
	// field exists; older checkpoints have none.
	Unprepared map[types.UID]Tombstone `json:"unprepared,omitempty"`
}

// PreparedClaim is one claim's GPUs.
type PreparedClaim struct {
	Namespace string           `json:"namespace"`
	Name      string           `json:"name"`
	Devices   []PreparedDevice `json:"devices"`
	// Consumers are the pods the claim was reserved for when it was prepared (status.
	// reservedFor), which its tombstone keeps.
	Consumers []types.UID `json:"consumers,omitempty"`
	// Pods names those pods (UID → name; a claim's consumers are in its namespace). An entry
	// whose claim looks stale is kept while one of them is still bound here and has not ended:
	// its containers still use the GPUs (a tenant can delete its claim and strip the
	// finalizer while its pod runs). Entries written before this field, or rewritten by an
	// older driver, get their pods from housekeeping's next read of a claim that still holds
	// its GPUs (judge); until then they are judged on the claim alone.
	Pods map[types.UID]string `json:"pods,omitempty"`
}

// Tombstone is an unprepared claim: when, and the pods it was reserved for by then. A later
// Prepare of the claim is for a pod that is gone unless the claim is now reserved for a pod
// outside Consumers.
type Tombstone struct {
	At        time.Time   `json:"at"`
	Consumers []types.UID `json:"consumers,omitempty"`
}

// PreparedDevice is one GPU prepared for a claim, with what it takes to answer the kubelet
// again and to rebuild the claim's CDI spec without the topology. A block gives one entry
// per GPU, each naming the block as its Device.
type PreparedDevice struct {
	// Requests are the claim's request names the device was allocated for.
	Requests []string `json:"requests"`
	Pool     string   `json:"pool"`
	Device   string   `json:"device"`
	// GPU is the GPU's index, Minor its /dev/nvidia<minor>, UUID its UUID when known.
	GPU          int      `json:"gpu"`
	Minor        int      `json:"minor"`
	UUID         string   `json:"uuid,omitempty"`
	CDIDeviceIDs []string `json:"cdiDeviceIDs"`
	// AdminAccess marks a device a monitoring pod may use beside its holder.
	AdminAccess bool `json:"adminAccess,omitempty"`
}

// NewCheckpoint returns an empty checkpoint with its header.
func NewCheckpoint() *Checkpoint {
	return &Checkpoint{APIVersion: CheckpointAPIVersion, Kind: CheckpointKind, Claims: map[types.UID]PreparedClaim{}}
}

// HolderOf returns the claim that holds a GPU of a pool, other than except, whether through
// the GPU's own device or a block; admin-access claims hold nothing.
func (c *Checkpoint) HolderOf(pool string, gpu int, except types.UID) (types.UID, PreparedClaim, bool) {
	uids := make([]types.UID, 0, len(c.Claims))
	for uid := range c.Claims {
		uids = append(uids, uid)
	}
	sort.Slice(uids, func(i, j int) bool { return uids[i] < uids[j] })
	for _, uid := range uids {
		if uid == except {
			continue
		}
		for _, d := range c.Claims[uid].Devices {
			if d.Pool == pool && d.GPU == gpu && !d.AdminAccess {
				return uid, c.Claims[uid], true
			}
		}
	}
	return "", PreparedClaim{}, false
}

// ReadCheckpoint reads the checkpoint at path; a missing file is an empty checkpoint.
func ReadCheckpoint(path string) (*Checkpoint, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return NewCheckpoint(), nil
	}
	if err != nil {
		return nil, fmt.Errorf("read DRA checkpoint: %w", err)
	}
	var header struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := json.Unmarshal(data, &header); err != nil {
		return nil, fmt.Errorf("DRA checkpoint %s is not JSON: %w", path, err)
	}
	if header.APIVersion != CheckpointAPIVersion || header.Kind != CheckpointKind {
		return nil, fmt.Errorf("DRA checkpoint %s has apiVersion %q, kind %q; this driver reads apiVersion %q, kind %q: drain the node's GPU pods, then remove the file",
			path, header.APIVersion, header.Kind, CheckpointAPIVersion, CheckpointKind)
	}
	c := NewCheckpoint()
	if err := json.Unmarshal(data, c); err != nil {
		return nil, fmt.Errorf("DRA checkpoint %s: %w", path, err)
	}
	if c.Claims == nil {
		c.Claims = map[types.UID]PreparedClaim{}
	}
	return c, nil
}

// WriteCheckpoint replaces the checkpoint at path atomically: a temporary file in the same
// directory, fsync, rename over the old one, then fsync of the directory so the rename itself
// survives a crash. A reader sees the old or the new checkpoint, never half of one.
func WriteCheckpoint(path string, c *Checkpoint) error {
	c.APIVersion, c.Kind = CheckpointAPIVersion, CheckpointKind
	data, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return fmt.Errorf("encode DRA checkpoint: %w", err)
	}
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write DRA checkpoint: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write DRA checkpoint %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("sync DRA checkpoint %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("close DRA checkpoint %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("install DRA checkpoint %s: %w", path, err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync DRA checkpoint directory %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync DRA checkpoint directory %s: %w", dir, err)
	}
	return nil
}

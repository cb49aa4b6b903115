package dra

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nvdomain/nvdomain/pkg/cdispec"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/topology"
)

// PrepareDevices computes the GPUs a claim was allocated on this node and the CDI devices
// that hand them to a container. It is a pure function of the claim's allocation, the
// topology and the CDI mode, so preparing a claim twice yields the same answer. It fails when
// an allocated device is not one of this node's GPUs: the allocation was made against slices
// that no longer describe the node.
func PrepareDevices(node string, claim *resourceapi.ResourceClaim, top *topology.Topology, mode CDIMode) ([]PreparedDevice, error) {
	if claim.Status.Allocation == nil {
		return nil, fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)
	}
	var out []PreparedDevice
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != names.DRADriver {
			continue
		}
		if r.Pool != node {
			return nil, fmt.Errorf("claim %s/%s: device %s was allocated from pool %q, but this node's pool is %q", claim.Namespace, claim.Name, r.Device, r.Pool, node)
		}
		gpus, ok := names.ParseDRADeviceGPUs(r.Device)
		if !ok {
			return nil, fmt.Errorf("claim %s/%s: device %q is not a device this driver publishes (gpu-<index> or gpus-<index>-…)", claim.Namespace, claim.Name, r.Device)
		}
		if err := blockThroughItsClass(claim, r); err != nil {
			return nil, err
		}
		// A block stands for its GPUs: each is prepared, and the kubelet gets all their CDI
		// devices for the one allocated device (Driver.PrepareResourceClaims groups them).
		for _, idx := range gpus {
			gpu, ok := top.GPU(idx)
			if !ok {
				return nil, fmt.Errorf("claim %s/%s: device %s holds GPU %d, which is not among this node's %d GPUs; the topology changed after the claim was allocated: delete the pod so that it is allocated again", claim.Namespace, claim.Name, r.Device, idx, len(top.GPUs))
			}
			d := PreparedDevice{Requests: []string{r.Request}, Pool: r.Pool, Device: r.Device, GPU: gpu.Index, Minor: gpu.DeviceMinor(), UUID: gpu.UUID,
				AdminAccess: r.AdminAccess != nil && *r.AdminAccess}
			switch mode {
			case CDINVIDIA:
				id := gpu.UUID
				if id == "" {
					id = fmt.Sprint(gpu.Index)
				}
				d.CDIDeviceIDs = []string{NVIDIAKind.Device(id)}
			default:
				d.CDIDeviceIDs = []string{CDIKind.Device(CDIDeviceID(claim.UID, gpu.Index))}
			}
			out = append(out, d)
		}
	}
	return out, nil
}

// blockThroughItsClass refuses a block allocated through any DeviceClass but
// names.DRABlockDeviceClass. The dra-blocks policy keeps tenants' claims from asking that class
// for blocks outside the templates' shape, and quota charges blocks under it; another class
// whose selector also matches blocks (made by anyone who may create DeviceClasses) would hand
// out k GPUs as one device that no quota line counts as k (review DRA 2026-12 #4a). An
// admin-access result takes nothing from other claims and passes.
func blockThroughItsClass(claim *resourceapi.ResourceClaim, r resourceapi.DeviceRequestAllocationResult) error {
	if !strings.HasPrefix(r.Device, names.DRABlockPrefix) || (r.AdminAccess != nil && *r.AdminAccess) {
		return nil
	}
	class := requestClass(claim, r.Request)
	if class == names.DRABlockDeviceClass {
		return nil
	}
	if class == "" {
		class = "(no class the claim's spec names for request " + r.Request + ")"
	}
	return fmt.Errorf("claim %s/%s: device %s, a block of GPUs, was allocated through DeviceClass %s; nvdomain hands out blocks only through %s, as its nvdomain-tp-<k> templates ask for them (quota and the %s policy count them there): remove blocks from that class's selector (add !(\"blockSize\" in device.attributes[\"%s\"]); for %s while nodes still publish blocks after dra.blocks went off, set the chart's dra.gpuClassExcludesBlocks=true), then delete this pod so that its claim is allocated again, or ask for GPUs through %s",
		claim.Namespace, claim.Name, r.Device, class, names.DRABlockDeviceClass, "dra-blocks", names.DRADriver, names.DRADeviceClass, names.DRADeviceClass)
}

// requestClass is the DeviceClass of a claim's request or subrequest ("<request>/<sub>"), as
// an allocation result names it ("" when the spec has no such request).
func requestClass(claim *resourceapi.ResourceClaim, request string) string {
	name, sub, _ := strings.Cut(request, "/")
	for _, req := range claim.Spec.Devices.Requests {
		if req.Name != name {
			continue
		}
		if sub == "" {
			if req.Exactly != nil {
				return req.Exactly.DeviceClassName
			}
			return ""
		}
		for _, s := range req.FirstAvailable {
			if s.Name == sub {
				return s.DeviceClassName
			}
		}
	}
	return ""
}

// State prepares and unprepares claims on one node, keeping the checkpoint and the CDI specs.
// It is safe for concurrent use.
type State struct {
	node   string
	mode   CDIMode
	cdiDir string
	// nvidia, when set in CDINVIDIA mode, checks a new claim's CDI names against NVIDIA's
	// specs on the node (SetNVIDIASpecs).
	nvidia         *NVIDIASpecs
	checkpointPath string
	log            logr.Logger

	mu  sync.Mutex
	top *topology.Topology
	now func() time.Time
	// consumersLive, when set, asks the apiserver whether any pod a tombstoned claim is
	// reserved for is still there, the same pod and not being deleted (SetConsumersLive).
	consumersLive ConsumersLive
	// prepares counts this process's Prepares of each claim (restores included), so that
	// housekeeping drops an entry only if no Prepare came between its read of the claim and
	// the drop (UnprepareIf).
	prepares map[types.UID]uint64
}

// ConsumersLive reports whether any pod a claim is reserved for is live: it exists with the
// UID the claim names and is not being deleted. known is false when the apiserver could not
// say (then the tombstone's own record decides).
type ConsumersLive func(ctx context.Context, claim *resourceapi.ResourceClaim) (live, known bool)

// SetConsumersLive makes a late Prepare be judged by the pods themselves (the driver passes
// one that reads them through the API).
func (s *State) SetConsumersLive(f ConsumersLive) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.consumersLive = f
}

// UnpreparedMemory is how long the checkpoint keeps an unprepared claim's tombstone: far
// longer than the kubelet takes to send a late Prepare (it reads the claim, then serialises
// the call behind the Unprepare), short enough that the checkpoint stays small.
const UnpreparedMemory = 10 * time.Minute

// LateError is Prepare's refusal of a claim unprepared in the last UnpreparedMemory that is
// reserved for no live pod (State.late): the Prepare is for a pod that is gone (the kubelet
// sent it after the Unprepare), and preparing would hold GPUs for nobody.
type LateError struct {
	Claim *resourceapi.ResourceClaim
	At    time.Time
}

func (e *LateError) Error() string {
	return fmt.Sprintf("claim %s/%s was unprepared at %s and is reserved for no live pod (each pod it names is gone, re-created under another UID, or being deleted): this Prepare came after its Unprepare, and is refused so that no GPU is held for a pod that is gone",
		e.Claim.Namespace, e.Claim.Name, e.At.Format(time.RFC3339))
}

// mergeUIDs is a ∪ b, sorted.
func mergeUIDs(a, b []types.UID) []types.UID {
	out := append(slices.Clone(a), b...)
	slices.Sort(out)
	return slices.Compact(out)
}

// mergePods adds the pods a claim is reserved for to a checkpoint entry's Pods (a copy).
func mergePods(pods map[types.UID]string, claim *resourceapi.ResourceClaim) map[types.UID]string {
	out := maps.Clone(pods)
	for _, r := range podConsumers(claim) {
		if out == nil {
			out = map[types.UID]string{}
		}
		out[r.UID] = r.Name
	}
	return out
}

// mergeConsumers adds the pods a claim is reserved for to its entry (Consumers and Pods), and
// reports whether that changed it.
func mergeConsumers(pc *PreparedClaim, claim *resourceapi.ResourceClaim) bool {
	merged, pods := mergeUIDs(pc.Consumers, consumerPods(claim)), mergePods(pc.Pods, claim)
	if len(merged) == len(pc.Consumers) && len(pods) == len(pc.Pods) {
		return false
	}
	pc.Consumers, pc.Pods = merged, pods
	return true
}

// RecordConsumers adds the pods a prepared claim (as the apiserver has it now, same UID) is
// reserved for to its checkpoint entry; nothing when the claim is not prepared here (it may
// have been unprepared since it was read) or its pods are known.
func (s *State) RecordConsumers(claim *resourceapi.ResourceClaim) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	cp, err := ReadCheckpoint(s.checkpointPath)
	if err != nil {
		return err
	}
	pc, ok := cp.Claims[claim.UID]
	if !ok || !mergeConsumers(&pc, claim) {
		return nil
	}
	cp.Claims[claim.UID] = pc
	return WriteCheckpoint(s.checkpointPath, cp)
}

// podConsumers are the pods in a claim's status.reservedFor.
func podConsumers(claim *resourceapi.ResourceClaim) []resourceapi.ResourceClaimConsumerReference {
	var out []resourceapi.ResourceClaimConsumerReference
	for _, r := range claim.Status.ReservedFor {
		if r.Resource == "pods" && r.APIGroup == "" {
			out = append(out, r)
		}
	}
	return out
}

// consumerPods are the UIDs of the pods a claim is reserved for, sorted.
func consumerPods(claim *resourceapi.ResourceClaim) []types.UID {
	var out []types.UID
	for _, r := range podConsumers(claim) {
		out = append(out, r.UID)
	}
	slices.Sort(out)
	return out
}

// late reports whether a Prepare of claim comes after its Unprepare: a tombstone from the last
// UnpreparedMemory, and the claim being deleted, or reserved for no live pod. Which pods are
// live the apiserver says (consumersLive); when it cannot, the tombstone's record does: the
// claim is reserved for nobody, or only for pods the tombstone lists (a pod that is new since
// the Unprepare is a real consumer).
//
// The apiserver's answer is asked for before the State's lock (askConsumers): one GET per pod,
// bounded at 5 s, must not stall every other Prepare, Unprepare and publish on the node (review
// DRA 2026-12 #2). A tombstone written between that read and the lock has no answer, and its
// record decides.
func (s *State) late(cp *Checkpoint, claim *resourceapi.ResourceClaim, asked consumersAnswer) (time.Time, bool) {
	ts, ok := cp.Unprepared[claim.UID]
	if !ok || s.now().Sub(ts.At) > UnpreparedMemory {
		return time.Time{}, false
	}
	if claim.DeletionTimestamp != nil {
		return ts.At, true
	}
	if asked.known && asked.tombstone.Equal(ts.At) {
		return ts.At, !asked.live
	}
	for _, uid := range consumerPods(claim) {
		if !slices.Contains(ts.Consumers, uid) {
			return time.Time{}, false
		}
	}
	return ts.At, true
}

// consumersAnswer is what the apiserver said of a claim's pods (ConsumersLive); known is false
// when it was not asked or could not say.
type consumersAnswer struct {
	live, known bool
	// tombstone is when the tombstone it was asked for was written: an answer counts only
	// for that one, not for a Prepare and Unprepare that came between the question and the
	// lock.
	tombstone time.Time
}

// askConsumers asks the apiserver whether a pod claim is reserved for is live, outside the
// State's lock, when the claim has a recent tombstone (the checkpoint is replaced atomically,
// so it can be read without the lock) and a ConsumersLive is set.
func (s *State) askConsumers(ctx context.Context, claim *resourceapi.ResourceClaim) consumersAnswer {
	s.mu.Lock()
	f := s.consumersLive
	s.mu.Unlock()
	if f == nil || claim.DeletionTimestamp != nil {
		return consumersAnswer{}
	}
	cp, err := ReadCheckpoint(s.checkpointPath)
	if err != nil {
		return consumersAnswer{}
	}
	ts, ok := cp.Unprepared[claim.UID]
	if !ok || s.now().Sub(ts.At) > UnpreparedMemory {
		return consumersAnswer{}
	}
	live, known := f(ctx, claim)
	return consumersAnswer{live: live, known: known, tombstone: ts.At}
}

// HeldError is Prepare's refusal of a GPU that another checkpointed claim holds.
type HeldError struct {
	Claim  *resourceapi.ResourceClaim // the claim being prepared
	Device PreparedDevice
	UID    types.UID
	Holder PreparedClaim
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("claim %s/%s: GPU %d (device %s) is already prepared for claim %s/%s (uid %s); it cannot go to two pods: wait until that pod ends",
		e.Claim.Namespace, e.Claim.Name, e.Device.GPU, e.Device.Device, e.Holder.Namespace, e.Holder.Name, e.UID)
}

// NewState returns the state of a node whose checkpoint lives in dataDir.
func NewState(node string, top *topology.Topology, mode CDIMode, cdiDir, dataDir string, log logr.Logger) *State {
	return &State{node: node, mode: mode, cdiDir: cdiDir, checkpointPath: filepath.Join(dataDir, CheckpointFile), log: log, top: top, now: time.Now}
}

// SetNVIDIASpecs makes Prepare, in CDINVIDIA mode, name each GPU as NVIDIA's CDI specs in
// specs.Dirs name it, and refuse a claim whose GPU they do not name. Call it before serving.
func (s *State) SetNVIDIASpecs(specs NVIDIASpecs) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(specs.Dirs) > 0 {
		s.nvidia = &specs
	}
}

// SetTopology replaces the topology that allocated device names are resolved against.
// Prepared claims keep what they hold.
func (s *State) SetTopology(top *topology.Topology) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.top = top
}

// Prepare returns a claim's prepared devices. A claim the checkpoint knows is restored from it
// (its CDI spec is written again if it is gone, as after a reboot that cleared a tmpfs);
// otherwise the devices are computed, the CDI spec is written, and only then the checkpoint,
// so a checkpointed claim always has its spec. A GPU that another claim holds is refused:
// the driver is the last line of defence against a device given twice. A Prepare that comes
// after the claim's Unprepare for the same pods is refused too (*LateError).
func (s *State) Prepare(ctx context.Context, claim *resourceapi.ResourceClaim) ([]PreparedDevice, error) {
	asked := s.askConsumers(ctx, claim)
	s.mu.Lock()
	defer s.mu.Unlock()
	cp, err := ReadCheckpoint(s.checkpointPath)
	if err != nil {
		return nil, err
	}
	if at, late := s.late(cp, claim, asked); late {
		return nil, &LateError{Claim: claim, At: at}
	}
	if pc, ok := cp.Claims[claim.UID]; ok {
		if err := s.restorable(claim, pc); err != nil {
			return nil, err
		}
		if err := s.ensureSpec(claim.UID, pc.Devices); err != nil {
			return nil, err
		}
		// A claim restored from the checkpoint (the kubelet asks again after it restarts): pods
		// reserved since, or an entry without pods, are recorded (housekeeping does the same).
		if mergeConsumers(&pc, claim) {
			cp.Claims[claim.UID] = pc
			if err := WriteCheckpoint(s.checkpointPath, cp); err != nil {
				return nil, err
			}
		}
		s.prepared(claim.UID)
		return pc.Devices, nil
	}
	devices, err := PrepareDevices(s.node, claim, s.top, s.mode)
	if err != nil {
		return nil, err
	}
	if s.mode == CDINVIDIA && s.nvidia != nil {
		gpus := make([]topology.GPU, len(devices))
		for i, d := range devices {
			gpus[i], _ = s.top.GPU(d.GPU)
		}
		names, err := s.nvidia.Resolve(gpus)
		if err != nil {
			return nil, fmt.Errorf("claim %s/%s: %w", claim.Namespace, claim.Name, err)
		}
		for i := range devices {
			devices[i].CDIDeviceIDs = []string{names[i]}
		}
	}
	for _, d := range devices {
		if d.AdminAccess {
			continue
		}
		if uid, holder, taken := cp.HolderOf(d.Pool, d.GPU, claim.UID); taken {
			return nil, &HeldError{Claim: claim, Device: d, UID: uid, Holder: holder}
		}
	}
	if err := s.writeSpec(claim.UID, devices); err != nil {
		return nil, err
	}
	cp.Claims[claim.UID] = PreparedClaim{Namespace: claim.Namespace, Name: claim.Name, Devices: devices, Consumers: consumerPods(claim), Pods: mergePods(nil, claim)}
	delete(cp.Unprepared, claim.UID)
	if err := WriteCheckpoint(s.checkpointPath, cp); err != nil {
		return nil, err
	}
	s.prepared(claim.UID)
	return devices, nil
}

// prepared counts a Prepare of uid; s.mu is held.
func (s *State) prepared(uid types.UID) {
	if s.prepares == nil {
		s.prepares = map[types.UID]uint64{}
	}
	s.prepares[uid]++
}

// Prepares is how many times this process prepared uid (restores included): what
// UnprepareIf compares.
func (s *State) Prepares(uid types.UID) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.prepares[uid]
}

// UnprepareIf unprepares uid only if it was not prepared again since Prepares returned
// seen: housekeeping read the claim as stale, and a Prepare (a restore of the claim allocated
// anew) between that read and the drop must win. It reports whether it unprepared.
func (s *State) UnprepareIf(ctx context.Context, uid types.UID, seen uint64) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.prepares[uid] != seen {
		return false, nil
	}
	return true, s.unprepareLocked(ctx, uid)
}

// Unprepare forgets a claim: its CDI spec goes, then its checkpoint entry, which leaves a
// tombstone with the pods it was prepared for (see LateError); tombstones older than
// UnpreparedMemory go in the same write. A claim the driver does not know is not an error;
// the kubelet may ask again after a restart.
func (s *State) Unprepare(ctx context.Context, uid types.UID) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.unprepareLocked(ctx, uid)
}

// unprepareLocked is Unprepare; s.mu is held.
func (s *State) unprepareLocked(_ context.Context, uid types.UID) error {
	cp, err := ReadCheckpoint(s.checkpointPath)
	if err != nil {
		return err
	}
	if err := s.removeSpec(uid); err != nil {
		return err
	}
	pc, known := cp.Claims[uid]
	_, tombstoned := cp.Unprepared[uid]
	if !known && tombstoned {
		return nil // a repeated Unprepare: the first one's tombstone and time stand
	}
	for u, ts := range cp.Unprepared {
		if s.now().Sub(ts.At) > UnpreparedMemory {
			delete(cp.Unprepared, u)
		}
	}
	if cp.Unprepared == nil {
		cp.Unprepared = map[types.UID]Tombstone{}
	}
	cp.Unprepared[uid] = Tombstone{At: s.now(), Consumers: pc.Consumers}
	delete(cp.Claims, uid)
	return WriteCheckpoint(s.checkpointPath, cp)
}

// restorable checks a checkpointed claim against the claim's current allocation before it is
// restored: the same devices of this node's pool, prepared in the CDI mode the driver runs
// in now. A checkpoint written for another allocation (the claim was deallocated and
// allocated again while the driver was down) or by a driver in another CDI mode would hand
// the container GPUs the scheduler did not give it, or CDI devices the runtime cannot
// resolve.
func (s *State) restorable(claim *resourceapi.ResourceClaim, pc PreparedClaim) error {
	want := map[string]bool{}
	if a := claim.Status.Allocation; a != nil {
		for _, r := range a.Devices.Results {
			if r.Driver == names.DRADriver && r.Pool == s.node {
				want[r.Device] = true
			}
		}
	}
	have := map[string]bool{}
	for _, d := range pc.Devices {
		have[d.Device] = true
		for _, id := range d.CDIDeviceIDs {
			kind, _, _ := cdispec.ParseName(id)
			if (s.mode == CDINVIDIA) != (kind == NVIDIAKind) {
				return fmt.Errorf("claim %s/%s: the checkpoint prepared it with CDI device %s, but the driver now runs with --dra-cdi=%s: delete the pod so that the claim is prepared again in this mode",
					claim.Namespace, claim.Name, id, s.mode)
			}
		}
	}
	if !maps.Equal(want, have) {
		return fmt.Errorf("claim %s/%s (uid %s): the checkpoint holds devices %v of an earlier allocation, but the claim is now allocated %v on this node: delete the pod so that the claim is prepared afresh",
			claim.Namespace, claim.Name, claim.UID, slices.Sorted(maps.Keys(have)), slices.Sorted(maps.Keys(want)))
	}
	return nil
}

// Prepared returns a copy of the checkpoint's claims, for tests and diagnostics.
func (s *State) Prepared() (map[types.UID]PreparedClaim, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cp, err := ReadCheckpoint(s.checkpointPath)
	if err != nil {
		return nil, err
	}
	return cp.Claims, nil
}

// RemoveOrphanSpecs deletes the claim specs of claims the checkpoint does not hold: left by a
// crash between writing a spec and the checkpoint, for a claim the kubelet then never
// prepared again.
func (s *State) RemoveOrphanSpecs() error {
	if s.mode != CDINvdomain {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cp, err := ReadCheckpoint(s.checkpointPath)
	if err != nil {
		return err
	}
	entries, err := os.ReadDir(s.cdiDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list CDI specs in %s: %w", s.cdiDir, err)
	}
	prefix := strings.TrimSuffix(ClaimSpecFile(""), ".json")
	for _, e := range entries {
		uid, ok := strings.CutPrefix(e.Name(), prefix)
		if !ok || !strings.HasSuffix(uid, ".json") {
			continue
		}
		uid = strings.TrimSuffix(uid, ".json")
		if _, known := cp.Claims[types.UID(uid)]; !known {
			s.log.Info("removing the CDI spec of a claim that is not prepared", "file", e.Name())
			if err := cdispec.RemoveFile(s.cdiDir, e.Name()); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *State) writeSpec(uid types.UID, devices []PreparedDevice) error {
	if s.mode != CDINvdomain || len(devices) == 0 {
		return nil
	}
	return cdispec.WriteFile(s.cdiDir, ClaimSpecFile(uid), ClaimSpec(uid, devices))
}

func (s *State) ensureSpec(uid types.UID, devices []PreparedDevice) error {
	if s.mode != CDINvdomain || len(devices) == 0 {
		return nil
	}
	if _, err := os.Stat(filepath.Join(s.cdiDir, ClaimSpecFile(uid))); err == nil {
		return nil
	}
	return s.writeSpec(uid, devices)
}

func (s *State) removeSpec(uid types.UID) error {
	if s.mode != CDINvdomain {
		return nil
	}
	return cdispec.RemoveFile(s.cdiDir, ClaimSpecFile(uid))
}

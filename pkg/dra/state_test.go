package dra

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nvdomain/nvdomain/pkg/cdispec"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/topology"
)

const node = "node-a"

// claim is an allocated claim of the given GPUs on node.
func claim(uid string, gpus ...int) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "llama-" + uid, UID: types.UID(uid)}}
	alloc := &resourceapi.AllocationResult{}
	for _, g := range gpus {
		alloc.Devices.Results = append(alloc.Devices.Results, resourceapi.DeviceRequestAllocationResult{
			Request: "gpus", Driver: names.DRADriver, Pool: node, Device: names.DRADeviceName(g)})
	}
	c.Status.Allocation = alloc
	return c
}

// blockClaim is claim uid allocated the block of gpus through the subrequest gpus/block of the
// block class, as the nvdomain-tp-<k> templates with blocks ask for it.
func blockClaim(uid string, gpus ...int) *resourceapi.ResourceClaim {
	c := claim(uid)
	c.Spec.Devices.Requests = []resourceapi.DeviceRequest{{Name: names.DRARequest, FirstAvailable: []resourceapi.DeviceSubRequest{
		{Name: names.DRASubBlock, DeviceClassName: names.DRABlockDeviceClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
		{Name: names.DRASubAny, DeviceClassName: names.DRADeviceClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: int64(len(gpus))},
	}}}
	c.Status.Allocation.Devices.Results = []resourceapi.DeviceRequestAllocationResult{{
		Request: names.DRARequest + "/" + names.DRASubBlock, Driver: names.DRADriver, Pool: node, Device: names.DRABlockName(gpus)}}
	return c
}

func TestCheckpointRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), CheckpointFile)
	empty, err := ReadCheckpoint(path)
	if err != nil || len(empty.Claims) != 0 {
		t.Fatalf("a missing checkpoint reads as %+v, %v; want empty", empty, err)
	}
	want := NewCheckpoint()
	want.Claims["u1"] = PreparedClaim{Namespace: "ml", Name: "c1", Devices: []PreparedDevice{
		{Requests: []string{"gpus"}, Pool: node, Device: "gpu-4", GPU: 4, Minor: 4, UUID: "GPU-4", CDIDeviceIDs: []string{"gpu.nvdomain.io/gpu=u1-gpu-4"}},
	}}
	if err := WriteCheckpoint(path, want); err != nil {
		t.Fatal(err)
	}
	got, err := ReadCheckpoint(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("read back %+v, wrote %+v", got, want)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("directory holds %d files after a write, want only the checkpoint (no temporary file left)", len(entries))
	}
}

func TestCheckpointWithAnotherHeaderIsRefused(t *testing.T) {
	cases := map[string]struct{ doc, want string }{
		"future version": {`{"apiVersion":"gpu.nvdomain.io/v2","kind":"DRACheckpoint","claims":{}}`, `apiVersion "gpu.nvdomain.io/v2"`},
		"another kind":   {`{"apiVersion":"gpu.nvdomain.io/v1","kind":"Checkpoint","claims":{}}`, `kind "Checkpoint"`},
		"no header":      {`{"claims":{}}`, "drain the node's GPU pods, then remove the file"},
		"not JSON":       {`{"apiVersion":`, "is not JSON"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), CheckpointFile)
			if err := os.WriteFile(path, []byte(tc.doc), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := ReadCheckpoint(path)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("ReadCheckpoint = %v, want an error mentioning %q", err, tc.want)
			}
		})
	}
}

func newState(t *testing.T, mode CDIMode) (*State, string, string) {
	t.Helper()
	cdiDir, dataDir := t.TempDir(), t.TempDir()
	return NewState(node, hgx(t), mode, cdiDir, dataDir, logr.Discard()), cdiDir, dataDir
}

func cdiIDs(devs []PreparedDevice) []string {
	var out []string
	for _, d := range devs {
		out = append(out, d.CDIDeviceIDs...)
	}
	return out
}

func TestPrepareDevicesNamesCDIDevicesByMode(t *testing.T) {
	noUUID := hgx(t)
	noUUID.GPUs[5].UUID = ""
	cases := []struct {
		name string
		mode CDIMode
		gpus []int
		want []string
	}{
		{"nvdomain", CDINvdomain, []int{4, 5}, []string{"gpu.nvdomain.io/gpu=u1-gpu-4", "gpu.nvdomain.io/gpu=u1-gpu-5"}},
		{"nvidia", CDINVIDIA, []int{4, 5}, []string{"nvidia.com/gpu=GPU-4", "nvidia.com/gpu=5"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			devs, err := PrepareDevices(node, claim("u1", tc.gpus...), noUUID, tc.mode)
			if err != nil {
				t.Fatal(err)
			}
			if got := cdiIDs(devs); !slices.Equal(got, tc.want) {
				t.Errorf("CDI devices %v, want %v", got, tc.want)
			}
			for _, id := range cdiIDs(devs) {
				_, gpu, uuid, ok := ParseCDIDevice(id)
				if !ok || (uuid == "" && !slices.Contains(tc.gpus, gpu)) || (uuid != "" && uuid != "GPU-4") {
					t.Errorf("ParseCDIDevice(%q) = gpu %d uuid %q ok %v", id, gpu, uuid, ok)
				}
			}
		})
	}
}

func TestPrepareDevicesRefusesWhatThisNodeDoesNotHave(t *testing.T) {
	other := claim("u1", 0)
	other.Status.Allocation.Devices.Results[0].Pool = "node-b"
	foreign := claim("u1", 0)
	foreign.Status.Allocation.Devices.Results = append(foreign.Status.Allocation.Devices.Results,
		resourceapi.DeviceRequestAllocationResult{Request: "nic", Driver: "nic.example.com", Pool: node, Device: "eth0"})
	cases := []struct {
		name  string
		claim *resourceapi.ResourceClaim
		want  string // "" means success
	}{
		{"unallocated", &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c"}}, "is not allocated"},
		{"another node's pool", other, `pool "node-b"`},
		{"a GPU the node does not have", claim("u1", 42), "delete the pod so that it is allocated again"},
		{"another driver's device is skipped", foreign, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			devs, err := PrepareDevices(node, tc.claim, hgx(t), CDINvdomain)
			switch {
			case tc.want == "" && (err != nil || len(devs) != 1):
				t.Errorf("got %v, %v; want the one GPU", devs, err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("got %v; want an error mentioning %q", err, tc.want)
			}
		})
	}
}

func TestPrepareIsIdempotentAndSurvivesARestart(t *testing.T) {
	s, cdiDir, dataDir := newState(t, CDINvdomain)
	ctx := context.Background()
	first, err := s.Prepare(ctx, claim("u1", 4, 5))
	if err != nil {
		t.Fatal(err)
	}
	specFile := filepath.Join(cdiDir, ClaimSpecFile("u1"))
	if _, err := os.Stat(specFile); err != nil {
		t.Fatalf("no CDI spec after Prepare: %v", err)
	}
	again, err := s.Prepare(ctx, claim("u1", 4, 5))
	if err != nil || !reflect.DeepEqual(first, again) {
		t.Errorf("second Prepare = %v, %v; want %v", again, err, first)
	}
	// A new process over the same directories, after a reboot cleared the CDI directory,
	// restores the claim from the checkpoint and writes its spec again.
	if err := os.Remove(specFile); err != nil {
		t.Fatal(err)
	}
	restarted := NewState(node, hgx(t), CDINvdomain, cdiDir, dataDir, logr.Discard())
	restored, err := restarted.Prepare(ctx, claim("u1", 4, 5))
	if err != nil || !reflect.DeepEqual(first, restored) {
		t.Errorf("Prepare after restart = %v, %v; want %v", restored, err, first)
	}
	if _, err := os.Stat(specFile); err != nil {
		t.Errorf("the restored claim has no CDI spec: %v", err)
	}
}

// The spec a claim gets is a valid CDI spec that a runtime resolves to the GPUs' device nodes
// (/dev/nvidia<minor>, not <index>) plus /dev/nvidiactl.
func TestClaimSpecResolvesToTheGPUsDeviceNodes(t *testing.T) {
	s, cdiDir, _ := newState(t, CDINvdomain)
	devs, err := s.Prepare(context.Background(), claim("u1", 0, 1))
	if err != nil {
		t.Fatal(err)
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(cdiDir), cdi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	var nodes []string
	for _, id := range cdiIDs(devs) {
		dev := cache.GetDevice(id)
		if dev == nil {
			t.Fatalf("CDI device %s not found in %s (errors %v)", id, cdiDir, cache.GetErrors())
		}
		for _, n := range dev.ContainerEdits.DeviceNodes {
			nodes = append(nodes, n.Path)
		}
	}
	if want := []string{"/dev/nvidia8", "/dev/nvidia7"}; !slices.Equal(nodes, want) {
		t.Errorf("device nodes %v, want %v (minors 8 and 7 of GPUs 0 and 1)", nodes, want)
	}
}

func TestAGPUIsNeverPreparedForTwoClaims(t *testing.T) {
	s, _, _ := newState(t, CDINvdomain)
	ctx := context.Background()
	if _, err := s.Prepare(ctx, claim("u1", 4, 5)); err != nil {
		t.Fatal(err)
	}
	_, err := s.Prepare(ctx, claim("u2", 5, 6))
	if err == nil || !strings.Contains(err.Error(), "GPU 5 (device gpu-5) is already prepared for claim default/llama-u1") {
		t.Fatalf("Prepare of a held GPU = %v", err)
	}
	// A monitoring pod with admin access may share it.
	admin := claim("u3", 5)
	admin.Status.Allocation.Devices.Results[0].AdminAccess = ptr.To(true)
	if _, err := s.Prepare(ctx, admin); err != nil {
		t.Errorf("admin-access claim refused: %v", err)
	}
	if err := s.Unprepare(ctx, "u1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Prepare(ctx, claim("u2", 5, 6)); err != nil {
		t.Errorf("Prepare after the holder was unprepared: %v", err)
	}
}

func TestUnprepareRemovesSpecAndIsIdempotent(t *testing.T) {
	s, cdiDir, _ := newState(t, CDINvdomain)
	ctx := context.Background()
	if _, err := s.Prepare(ctx, claim("u1", 0, 1)); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := s.Unprepare(ctx, "u1"); err != nil {
			t.Fatalf("Unprepare #%d: %v", i+1, err)
		}
	}
	if _, err := os.Stat(filepath.Join(cdiDir, ClaimSpecFile("u1"))); !os.IsNotExist(err) {
		t.Errorf("the claim's CDI spec is still there: %v", err)
	}
	if got, _ := s.Prepared(); len(got) != 0 {
		t.Errorf("checkpoint still holds %v", got)
	}
}

func TestNVIDIAModeWritesNoSpec(t *testing.T) {
	s, cdiDir, _ := newState(t, CDINVIDIA)
	if _, err := s.Prepare(context.Background(), claim("u1", 0, 1)); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(cdiDir); len(entries) != 0 {
		t.Errorf("NVIDIA mode wrote %d files into the CDI directory; NVIDIA's own spec names the GPUs", len(entries))
	}
}

func TestOrphanSpecsAreRemovedAtStart(t *testing.T) {
	s, cdiDir, _ := newState(t, CDINvdomain)
	if _, err := s.Prepare(context.Background(), claim("kept", 0)); err != nil {
		t.Fatal(err)
	}
	orphan := ClaimSpecFile("crashed-before-checkpoint")
	other := "nvidia.com-gpu.json" // not ours
	for _, f := range []string{orphan, other} {
		if err := os.WriteFile(filepath.Join(cdiDir, f), []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.RemoveOrphanSpecs(); err != nil {
		t.Fatal(err)
	}
	for f, want := range map[string]bool{ClaimSpecFile("kept"): true, orphan: false, other: true} {
		_, err := os.Stat(filepath.Join(cdiDir, f))
		if (err == nil) != want {
			t.Errorf("%s present = %v, want %v", f, err == nil, want)
		}
	}
}

func TestParseCDIDevice(t *testing.T) {
	cases := []struct {
		name  string
		claim types.UID
		gpu   int
		uuid  string
		ok    bool
	}{
		{"gpu.nvdomain.io/gpu=6f1c2b9e-1d2a-4c7e-9a51-0c3b8d2e4f10-gpu-7", "6f1c2b9e-1d2a-4c7e-9a51-0c3b8d2e4f10", 7, "", true},
		{"nvidia.com/gpu=GPU-8a1b", "", -1, "GPU-8a1b", true},
		{"nvidia.com/gpu=3", "", 3, "", true},
		{"gpu.nvdomain.io/gpu=u1-gpu-x", "", 0, "", false},
		{"gpu.nvdomain.io/gpu=gpu-1", "", 0, "", false},
		{"k8s.device-plugin.nvidia.com/gpu=GPU-1", "", 0, "", false},
		{"garbage", "", 0, "", false},
	}
	for _, tc := range cases {
		c, g, u, ok := ParseCDIDevice(tc.name)
		if ok != tc.ok || (ok && (c != tc.claim || g != tc.gpu || u != tc.uuid)) {
			t.Errorf("ParseCDIDevice(%q) = %q %d %q %v, want %q %d %q %v", tc.name, c, g, u, ok, tc.claim, tc.gpu, tc.uuid, tc.ok)
		}
	}
}

// A block is prepared as its GPUs: one kubelet device with the CDI devices of all of them, and
// a GPU held through a block is held for single-GPU claims too, and the other way round.
func TestBlocksArePreparedAsTheirGPUs(t *testing.T) {
	s, _, _ := newState(t, CDINvdomain)
	ctx := context.Background()
	block := blockClaim("b1", 4, 5, 6, 7)
	devs, err := s.Prepare(ctx, block)
	if err != nil {
		t.Fatal(err)
	}
	var gpus []int
	for _, d := range devs {
		gpus = append(gpus, d.GPU)
		if d.Device != "gpus-4-5-6-7" {
			t.Errorf("GPU %d prepared as device %q", d.GPU, d.Device)
		}
	}
	if !slices.Equal(gpus, []int{4, 5, 6, 7}) {
		t.Fatalf("block prepared as GPUs %v", gpus)
	}
	kd := kubeletDevices(devs)
	if len(kd) != 1 || kd[0].DeviceName != "gpus-4-5-6-7" || len(kd[0].CDIDeviceIDs) != 4 || kd[0].Requests[0] != "gpus/block" {
		t.Errorf("the kubelet is told %+v, want one device with 4 CDI devices", kd)
	}
	if _, err := s.Prepare(ctx, claim("u2", 6)); err == nil || !strings.Contains(err.Error(), "GPU 6 (device gpu-6) is already prepared for claim default/llama-b1") {
		t.Errorf("a single GPU of a prepared block: %v", err)
	}
	if err := s.Unprepare(ctx, "b1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Prepare(ctx, claim("u2", 6)); err != nil {
		t.Fatal(err)
	}
	// The same block for a new claim (the unprepared one's own late Prepare is LateError's).
	again := block.DeepCopy()
	again.UID = "b3"
	if _, err := s.Prepare(ctx, again); err == nil || !strings.Contains(err.Error(), "GPU 6 (device gpus-4-5-6-7) is already prepared for claim default/llama-u2") {
		t.Errorf("a block holding a prepared GPU: %v", err)
	}
	bad := claim("b2")
	bad.Status.Allocation.Devices.Results = []resourceapi.DeviceRequestAllocationResult{{Request: "gpus", Driver: names.DRADriver, Pool: node, Device: "gpus-7-4"}}
	if _, err := s.Prepare(ctx, bad); err == nil || !strings.Contains(err.Error(), "not a device this driver publishes") {
		t.Errorf("a block name out of order: %v", err)
	}
}

// A Prepare that comes after the claim's Unprepare is refused while the claim is reserved only
// for the pods it was prepared for (NVIDIA's #1162: the kubelet read the claim before the
// Unprepare and sent the Prepare after it, for a pod that is gone), across a restart of the
// driver (the tombstone is in the checkpoint), and allowed for a new pod; tombstones expire.
func TestLatePrepareIsRefusedByTheCheckpointsTombstone(t *testing.T) {
	dir := t.TempDir()
	now := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	newState := func() *State {
		s := NewState(node, hgx(t), CDINvdomain, t.TempDir(), dir, logr.Discard())
		s.now = func() time.Time { return now }
		return s
	}
	ctx := context.Background()
	shared := reserved(claim("shared", 2), "pod-a", "pod-b")
	cases := []struct {
		name  string
		claim *resourceapi.ResourceClaim
		after time.Duration
		late  bool
	}{
		{"the same pods", shared, time.Second, true},
		{"one of the same pods", reserved(shared, "pod-b"), time.Second, true},
		{"reserved for nobody", reserved(shared), time.Second, true},
		{"a new pod beside an old one", reserved(shared, "pod-a", "pod-c"), time.Second, false},
		{"a new pod", reserved(shared, "pod-c"), time.Second, false},
		{"the same pods, after the tombstone expired", shared, UnpreparedMemory + time.Second, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			now = time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
			if err := os.RemoveAll(filepath.Join(dir, CheckpointFile)); err != nil {
				t.Fatal(err)
			}
			s := newState()
			if _, err := s.Prepare(ctx, shared); err != nil {
				t.Fatal(err)
			}
			if err := s.Unprepare(ctx, shared.UID); err != nil {
				t.Fatal(err)
			}
			// A repeated Unprepare keeps the first one's tombstone.
			if err := s.Unprepare(ctx, shared.UID); err != nil {
				t.Fatal(err)
			}
			now = now.Add(tc.after)
			// The driver restarted in between: only the checkpoint remembers.
			_, err := newState().Prepare(ctx, tc.claim)
			var le *LateError
			if got := errors.As(err, &le); got != tc.late {
				t.Fatalf("late = %v (%v), want %v", got, err, tc.late)
			}
			if !tc.late && err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A shared claim restored for a second pod records that pod too, so its late Prepare is known
// for what it is without the apiserver; with the apiserver, a pod that is live gets its
// Prepare even when the tombstone lists it (it was reserved before its first Prepare).
func TestTombstoneConsumersAndLivePods(t *testing.T) {
	ctx := context.Background()
	s := NewState(node, hgx(t), CDINvdomain, t.TempDir(), t.TempDir(), logr.Discard())
	c := claim("shared", 2)
	for _, pods := range [][]string{{"pod-a"}, {"pod-a", "pod-b"}} {
		if _, err := s.Prepare(ctx, reserved(c, pods...)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Unprepare(ctx, c.UID); err != nil {
		t.Fatal(err)
	}
	var le *LateError
	if _, err := s.Prepare(ctx, reserved(c, "pod-b")); !errors.As(err, &le) {
		t.Fatalf("the late Prepare of the pod added on restore: %v", err)
	}
	s.SetConsumersLive(func(context.Context, *resourceapi.ResourceClaim) (bool, bool) { return true, true })
	if _, err := s.Prepare(ctx, reserved(c, "pod-b")); err != nil {
		t.Fatalf("pod-b is live: %v", err)
	}
}

// reserved is a copy of c reserved for the named pods (their UIDs are their names).
func reserved(c *resourceapi.ResourceClaim, pods ...string) *resourceapi.ResourceClaim {
	c = c.DeepCopy()
	c.Status.ReservedFor = nil
	for _, p := range pods {
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: p, UID: types.UID(p)})
	}
	return c
}

// A block is prepared only when it was allocated through the block class, which the
// dra-blocks policy and quota watch; another class whose selector also matches blocks would
// hand out k GPUs as one uncounted device (review DRA 2026-12 #4a).
func TestABlockIsPreparedOnlyThroughTheBlockClass(t *testing.T) {
	top := hgx(t)
	through := func(class string, admin bool) *resourceapi.ResourceClaim {
		c := claim("u1")
		c.Spec.Devices.Requests = []resourceapi.DeviceRequest{{Name: "gpus", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class, Count: 1}}}
		c.Status.Allocation.Devices.Results = []resourceapi.DeviceRequestAllocationResult{{Request: "gpus", Driver: names.DRADriver, Pool: node,
			Device: names.DRABlockName([]int{0, 1}), AdminAccess: ptr.To(admin)}}
		return c
	}
	for _, tc := range []struct {
		name  string
		claim *resourceapi.ResourceClaim
		want  string // "": prepared
	}{
		{"the templates' subrequest of the block class", blockClaim("u1", 0, 1), ""},
		{"a request of the block class", through(names.DRABlockDeviceClass, false), ""},
		{"another class selecting blocks", through("all-gpus.example.com", false), "allocated through DeviceClass all-gpus.example.com"},
		{"the single-GPU class", through(names.DRADeviceClass, false), "allocated through DeviceClass " + names.DRADeviceClass},
		{"admin access through another class", through("all-gpus.example.com", true), ""},
		{"a request the spec does not name", func() *resourceapi.ResourceClaim {
			c := through(names.DRABlockDeviceClass, false)
			c.Status.Allocation.Devices.Results[0].Request = "other"
			return c
		}(), "no class the claim's spec names for request other"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			devs, err := PrepareDevices(node, tc.claim, top, CDINvdomain)
			switch {
			case tc.want == "" && (err != nil || len(devs) != 2):
				t.Errorf("prepared %v, %v; want the block's 2 GPUs", devs, err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), names.DRABlockDeviceClass)):
				t.Errorf("prepared %v, %v; want a refusal mentioning %q and the block class", devs, err, tc.want)
			}
		})
	}
}

// The apiserver is asked about a tombstoned claim's pods outside the State's lock: while it
// takes its time (up to 5 s of GETs for a shared claim), the node's other Prepares and
// Unprepares go on (review DRA 2026-12 #2).
func TestALateClaimsPodsAreAskedAboutOutsideTheLock(t *testing.T) {
	ctx := context.Background()
	s := NewState(node, hgx(t), CDINvdomain, t.TempDir(), t.TempDir(), logr.Discard())
	late := claim("late", 2)
	if _, err := s.Prepare(ctx, reserved(late, "pod-a")); err != nil {
		t.Fatal(err)
	}
	if err := s.Unprepare(ctx, late.UID); err != nil {
		t.Fatal(err)
	}
	asking, answer := make(chan struct{}), make(chan struct{})
	s.SetConsumersLive(func(context.Context, *resourceapi.ResourceClaim) (bool, bool) {
		close(asking)
		<-answer
		return false, true
	})
	lateDone := make(chan error, 1)
	go func() {
		_, err := s.Prepare(ctx, reserved(late, "pod-a"))
		lateDone <- err
	}()
	<-asking
	otherDone := make(chan error, 1)
	go func() {
		_, err := s.Prepare(ctx, reserved(claim("other", 5), "pod-b"))
		if err == nil {
			err = s.Unprepare(ctx, "other")
		}
		otherDone <- err
	}()
	select {
	case err := <-otherDone:
		if err != nil {
			t.Errorf("another claim's Prepare and Unprepare: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("another claim's Prepare waited for the apiserver's answer about the late one")
	}
	close(answer)
	var le *LateError
	if err := <-lateDone; !errors.As(err, &le) {
		t.Errorf("the late Prepare: %v, want a LateError (its pod is gone)", err)
	}
}

// In CDINVIDIA mode a new claim's GPUs are named as NVIDIA's own CDI spec on the node names
// them (by UUID, else by index), and a claim whose GPU no spec names is refused at Prepare
// with the fix, instead of every container failing at creation (review DRA 2026-12 #7); the
// refusal writes no checkpoint entry, so the claim prepares once the spec is right.
func TestNVIDIAModeNamesWhatNVIDIAsSpecNames(t *testing.T) {
	gpus := hgx(t).GPUs
	byIndex := slices.Clone(gpus)
	for i := range byIndex {
		byIndex[i].UUID = ""
	}
	other := []topology.GPU{{Index: 0, UUID: "GPU-elsewhere"}}
	cases := []struct {
		name    string
		spec    []topology.GPU // NVIDIA's spec in the second directory; nil: none
		broken  bool           // and a spec file that cannot be parsed in the first
		want    []string
		wantErr []string
	}{
		{name: "named by UUID", spec: gpus, want: []string{"nvidia.com/gpu=GPU-4", "nvidia.com/gpu=GPU-5"}},
		{name: "named by index only", spec: byIndex, want: []string{"nvidia.com/gpu=4", "nvidia.com/gpu=5"}},
		{name: "no spec", wantErr: []string{"no CDI spec of kind nvidia.com/gpu", "nvidia-ctk cdi generate", "node.cdiSpecDirs"}},
		{name: "another machine's spec", spec: other, broken: true,
			wantErr: []string{"names no device for GPU 4", "nvidia.com/gpu=GPU-elsewhere", "could not be read", "--device-name-strategy"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, _, _ := newState(t, CDINVIDIA)
			dirs := []string{t.TempDir(), t.TempDir()}
			if tc.spec != nil {
				if err := cdispec.Write(dirs[1], NVIDIAKind, cdispec.ForGPUs(NVIDIAKind, tc.spec)); err != nil {
					t.Fatal(err)
				}
			}
			if tc.broken {
				if err := os.WriteFile(filepath.Join(dirs[0], "broken.yaml"), []byte("cdiVersion: [\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			s.SetNVIDIASpecs(NVIDIASpecs{Dirs: dirs})
			devs, err := s.Prepare(context.Background(), claim("u1", 4, 5))
			if tc.wantErr != nil {
				if err == nil {
					t.Fatalf("prepared %v, want a refusal", cdiIDs(devs))
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not name %q", err, w)
					}
				}
				if pcs, _ := s.Prepared(); len(pcs) != 0 {
					t.Errorf("a refused claim was checkpointed: %v", pcs)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := cdiIDs(devs); !slices.Equal(got, tc.want) {
				t.Errorf("CDI devices %v, want %v", got, tc.want)
			}
		})
	}
}

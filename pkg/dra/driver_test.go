package dra

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/version"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/topology"
)

// kubelet plays the kubelet's two sides of the plugin protocol over the real sockets.
type kubelet struct {
	t   *testing.T
	dir string
}

func dial(t *testing.T, path string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// register does what the kubelet's plugin watcher does with a new registration socket, and
// returns the DRA service's endpoint.
func (k kubelet) register(ctx context.Context) string {
	k.t.Helper()
	reg := registerapi.NewRegistrationClient(dial(k.t, filepath.Join(k.dir, "plugins_registry", names.DRADriver+"-reg.sock")))
	info, err := reg.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		k.t.Fatalf("GetInfo on the registration socket: %v", err)
	}
	if info.Type != registerapi.DRAPlugin || info.Name != names.DRADriver || info.Endpoint != filepath.Join(k.dir, "plugins", names.DRADriver, "dra.sock") {
		k.t.Fatalf("registration info %+v", info)
	}
	if _, err := reg.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		k.t.Fatal(err)
	}
	return info.Endpoint
}

func (k kubelet) prepare(ctx context.Context, endpoint string, c *resourceapi.ResourceClaim) []string {
	k.t.Helper()
	resp, err := drapb.NewDRAPluginClient(dial(k.t, endpoint)).NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{
		Claims: []*drapb.Claim{{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}}})
	if err != nil {
		k.t.Fatalf("NodePrepareResources: %v", err)
	}
	r := resp.Claims[string(c.UID)]
	if r == nil || r.Error != "" {
		k.t.Fatalf("NodePrepareResources for %s: %+v", c.Name, r)
	}
	var ids []string
	for _, d := range r.Devices {
		ids = append(ids, d.CdiDeviceIds...)
	}
	return ids
}

func (k kubelet) unprepare(ctx context.Context, endpoint string, c *resourceapi.ResourceClaim) {
	k.t.Helper()
	resp, err := drapb.NewDRAPluginClient(dial(k.t, endpoint)).NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{
		Claims: []*drapb.Claim{{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}}})
	if err != nil || resp.Claims[string(c.UID)] == nil || resp.Claims[string(c.UID)].Error != "" {
		k.t.Fatalf("NodeUnprepareResources: %v %+v", err, resp)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func sliceDevices(ctx context.Context, t *testing.T, cs *fake.Clientset) []string {
	t.Helper()
	var out []string
	for _, d := range publishedDevices(ctx, t, cs) {
		out = append(out, d.Name)
	}
	return out
}

// publishedDevices are the devices of the driver's ResourceSlices, whose driver, node and
// pool it checks.
func publishedDevices(ctx context.Context, t *testing.T, cs *fake.Clientset) []resourceapi.Device {
	t.Helper()
	list, err := cs.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []resourceapi.Device
	for _, s := range list.Items {
		if s.Spec.Driver != names.DRADriver || s.Spec.NodeName == nil || *s.Spec.NodeName != node || s.Spec.Pool.Name != node {
			t.Errorf("slice %s: driver %s node %v pool %s", s.Name, s.Spec.Driver, s.Spec.NodeName, s.Spec.Pool.Name)
		}
		out = append(out, s.Spec.Devices...)
	}
	return out
}

// The unix socket paths must stay under 108 bytes, which t.TempDir's long names can exceed.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "dra")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func TestDriverRegistersPreparesPublishesAndSurvivesARestart(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := shortDir(t)
	held := claim("u1", 4, 5)
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "node-uid"}}, held)
	fatal := make(chan error, 4)
	o := Options{Node: node, Client: cs, KubeletDir: dir, CDI: CDINvdomain, CDISpecDir: filepath.Join(dir, "cdi"), Topology: hgx(t),
		Log: logr.Discard(), Fatal: func(err error) { fatal <- err }}
	d, err := Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	k := kubelet{t, dir}
	if d.Registered() {
		t.Error("registered before the kubelet said so")
	}
	endpoint := k.register(ctx)
	waitFor(t, "the registration status", d.Registered)
	want := []string{"gpu.nvdomain.io/gpu=u1-gpu-4", "gpu.nvdomain.io/gpu=u1-gpu-5"}
	if got := k.prepare(ctx, endpoint, held); !slices.Equal(got, want) {
		t.Errorf("prepared CDI devices %v, want %v", got, want)
	}
	waitFor(t, "a ResourceSlice with the node's 9 GPUs", func() bool { return len(sliceDevices(ctx, t, cs)) == 9 })

	// The topology loses its lone GPU: the slice follows.
	smaller := hgx(t)
	smaller, err = topology.FromDomains(names.SourceSimulated, smaller.GPUs[:8], [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.SetTopology(ctx, smaller); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the ResourceSlice to drop gpu-8", func() bool {
		devs := sliceDevices(ctx, t, cs)
		return len(devs) == 8 && !slices.Contains(devs, "gpu-8")
	})

	// Restart: a new driver over the same directories registers again, answers the claim it
	// prepared before from its checkpoint, and unprepares it. Its topology lacks GPUs 4 and 5,
	// so only the checkpoint can answer for them.
	d.Stop()
	o.Topology, err = topology.FromDomains(names.SourceSimulated, smaller.GPUs[:4], [][]int{{0, 1, 2, 3}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	d, err = Start(ctx, o)
	if err != nil {
		t.Fatalf("restart: %v", err)
	}
	defer d.Stop()
	endpoint = k.register(ctx)
	if got := k.prepare(ctx, endpoint, held); !slices.Equal(got, want) {
		t.Errorf("after restart, prepared CDI devices %v, want %v", got, want)
	}
	k.unprepare(ctx, endpoint, held)
	if _, err := os.Stat(filepath.Join(o.CDISpecDir, ClaimSpecFile(held.UID))); !os.IsNotExist(err) {
		t.Errorf("claim spec still present after unprepare: %v", err)
	}
	select {
	case err := <-fatal:
		t.Errorf("unexpected fatal error: %v", err)
	default:
	}
}

func TestHandleErrorEndsTheProcessOnlyForUnrecoverableErrors(t *testing.T) {
	cases := []struct {
		name  string
		err   error
		fatal bool
	}{
		{"dead gRPC server", errors.New("accept: use of closed network connection"), true},
		{"transient publish error", errors.Join(kubeletplugin.ErrRecoverable, errors.New("connection refused")), false},
	}
	for _, tc := range cases {
		var got error
		d := &Driver{o: Options{Log: logr.Discard(), Fatal: func(err error) { got = err }}}
		d.HandleError(context.Background(), tc.err, "background")
		if (got != nil) != tc.fatal {
			t.Errorf("%s: Fatal called with %v, want fatal=%v", tc.name, got, tc.fatal)
		}
		if got != nil && !strings.Contains(got.Error(), "DRA driver: background") {
			t.Errorf("%s: fatal error %q lacks context", tc.name, got)
		}
	}
}

func TestOptionsNameTheFlagAtFault(t *testing.T) {
	good := Options{Node: node, Client: fake.NewClientset(), KubeletDir: DefaultKubeletDir, CDI: CDINvdomain, CDISpecDir: "/var/run/cdi", Topology: &topology.Topology{}}
	cases := []struct {
		mutate func(*Options)
		want   string
	}{
		{func(o *Options) { o.Node = "" }, "--node-name"},
		{func(o *Options) { o.KubeletDir = "" }, "--dra-kubelet-dir"},
		{func(o *Options) { o.CDI = "cdi" }, "--dra-cdi"},
		{func(o *Options) { o.CDISpecDir = "" }, "--cdi-spec-dir"},
	}
	if err := good.Validate(); err != nil {
		t.Fatalf("good options: %v", err)
	}
	for _, tc := range cases {
		o := good
		tc.mutate(&o)
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate = %v, want a message naming %s", err, tc.want)
		}
	}
}

// Blocks cost O(N²) per pod on a scheduler allocator without kubernetes#138917 (before 1.37):
// the driver publishes them only for an apiserver of BlocksMinVersion or later, and says why
// on the Node otherwise. A version it cannot parse (a development build) is not judged.
func TestBlocksArePublishedOnlyForAnAllocatorThatScalesWithThem(t *testing.T) {
	for _, tc := range []struct {
		version    string
		wantBlocks bool
	}{
		{"v1.35.4", false},
		{"v1.36.3", false},
		{"v1.37.0-rc.1", true},
		{"v1.37.2", true},
		{"v1.38.0", true},
		{"v0.0.0-master+$Format:%H$", true},
	} {
		t.Run(tc.version, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			dir := shortDir(t)
			cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "node-uid"}})
			cs.Discovery().(*fakediscovery.FakeDiscovery).FakedServerVersion = &version.Info{GitVersion: tc.version}
			o := Options{Node: node, Client: cs, KubeletDir: dir, CDI: CDINvdomain, CDISpecDir: filepath.Join(dir, "cdi"), Topology: hgx(t),
				Blocks: true, Log: logr.Discard()}
			d, err := Start(ctx, o)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Stop()
			k := kubelet{t, dir}
			k.register(ctx)
			waitFor(t, "a ResourceSlice with the node's GPUs", func() bool { return slices.Contains(sliceDevices(ctx, t, cs), "gpu-8") })
			blocks := slices.ContainsFunc(sliceDevices(ctx, t, cs), func(name string) bool { return strings.HasPrefix(name, "gpus-") })
			if blocks != tc.wantBlocks {
				t.Errorf("blocks published: %v, want %v (devices %v)", blocks, tc.wantBlocks, sliceDevices(ctx, t, cs))
			}
			events, err := cs.CoreV1().Events("").List(ctx, metav1.ListOptions{})

			if err != nil {
				t.Fatal(err)
			}
			var refused []string
			for _, e := range events.Items {
				if e.Reason == ReasonBlocksRefused {
					refused = append(refused, e.Message)
				}
			}
			switch {
			case tc.wantBlocks && len(refused) > 0:
				t.Errorf("refusal Event on an allocator that scales: %v", refused)
			case !tc.wantBlocks && (len(refused) != 1 || !strings.Contains(refused[0], tc.version) || !strings.Contains(refused[0], "1.37") || !strings.Contains(refused[0], "dra.blocks=false")):
				t.Errorf("refusal Events %q; want one naming %s, 1.37 and dra.blocks=false", refused, tc.version)
			}
		})
	}
}

// An apiserver that cannot tell its version when the driver starts gets no blocks until it
// can: housekeeping asks again each round, and publishes them once the answer allows.
func TestBlocksWaitForTheApiserversVersion(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := shortDir(t)
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "node-uid"}})
	cs.Discovery().(*fakediscovery.FakeDiscovery).FakedServerVersion = &version.Info{GitVersion: "v1.37.2"}
	var down atomic.Bool
	down.Store(true)
	cs.PrependReactor("get", "version", func(k8stesting.Action) (bool, k8sruntime.Object, error) {
		if down.Load() {
			return true, nil, errors.New("connection refused")
		}
		return false, nil, nil
	})
	d, err := Start(ctx, Options{Node: node, Client: cs, KubeletDir: dir, CDI: CDINvdomain, CDISpecDir: filepath.Join(dir, "cdi"), Topology: hgx(t),
		Blocks: true, Log: logr.Discard(), HousekeepingPeriod: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	(kubelet{t, dir}).register(ctx)
	blocks := func() bool {
		return slices.ContainsFunc(sliceDevices(ctx, t, cs), func(name string) bool { return strings.HasPrefix(name, "gpus-") })
	}
	waitFor(t, "a ResourceSlice with the node's GPUs", func() bool { return slices.Contains(sliceDevices(ctx, t, cs), "gpu-8") })
	if blocks() {
		t.Fatal("blocks published before the apiserver told its version")
	}
	d.Housekeep(ctx) // still down
	if blocks() {
		t.Fatal("blocks published while the apiserver still cannot tell its version")
	}
	down.Store(false)
	d.Housekeep(ctx)
	waitFor(t, "blocks once the apiserver says v1.37.2", blocks)
}

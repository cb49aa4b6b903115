package nriplugin

import (
	"bytes"
	"context"
	"flag"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/nvdomain/nvdomain/pkg/names"
)

// eventually waits for cond, failing the test after a generous deadline: it waits for
// connections over real sockets, and asserts nothing about how long they take.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// containerd restarting closes the plugin's connection; the plugin must connect to the new
// runtime in-process (exiting would crash-loop the DaemonSet's pod while every GPU container
// is refused), report not-ready meanwhile, and serve again after the new Synchronize.
func TestServeReconnectsWhenTheRuntimeRestarts(t *testing.T) {
	// Unix socket paths must stay under 108 bytes; t.TempDir() can be longer.
	dir, err := os.MkdirTemp("", "nri")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "nri.sock")

	// The runtime's end of a connection dies with its process; in one test process the
	// plugin's connections are closed by hand instead.
	var mu sync.Mutex
	var conns []net.Conn
	dial := func(path string) (net.Conn, error) {
		c, err := net.Dial("unix", path)
		if err == nil {
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
		return c, err
	}
	pod := pinnedPod("a", 1, `{"vllm":2}`)
	startRuntime := func(ctrs ...*api.Container) *adaptation.Adaptation {
		syncFn := func(ctx context.Context, cb adaptation.SyncCB) error {
			_, err := cb(ctx, []*api.PodSandbox{pod}, ctrs)
			return err
		}
		updateFn := func(context.Context, []*api.ContainerUpdate) ([]*api.ContainerUpdate, error) { return nil, nil }
		r, err := adaptation.New("test-runtime", "v0.0.1", syncFn, updateFn, adaptation.WithSocketPath(sock),
			adaptation.WithPluginPath(filepath.Join(dir, "plugins")), adaptation.WithPluginConfigPath(filepath.Join(dir, "conf")))
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Start(); err != nil {
			t.Fatal(err)
		}
		return r
	}
	// create asks the runtime to create a container until the plugin, which the runtime adds
	// to its list only once Synchronize has returned, adjusts it.
	create := func(r *adaptation.Adaptation, c *api.Container) string {
		t.Helper()
		var got string
		eventually(t, "the plugin adjusts "+c.Id, func() bool {
			resp, err := r.CreateContainer(context.Background(), &adaptation.CreateContainerRequest{Pod: pod, Container: c})
			if err != nil {
				t.Fatalf("create %s: %v", c.Id, err)
			}
			got = envOf(resp.GetAdjust())["NVIDIA_VISIBLE_DEVICES"]
			return got != ""
		})
		return got
	}

	p, _, m := newPlugin(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	opts := []stub.Option{stub.WithSocketPath(sock), stub.WithPluginName("nvdomain"), stub.WithPluginIdx("10"), stub.WithDialer(dial)}
	// The runtime is not up yet: serve keeps trying.
	go func() {
		done <- serve(ctx, p, opts, Backoff{Initial: time.Millisecond, Max: 20 * time.Millisecond}, logr.Discard())
	}()
	if p.Ready() {
		t.Fatal("ready before any runtime was there")
	}

	first := startRuntime()
	eventually(t, "ready with the first runtime", p.Ready)
	if got := create(first, envGiven("a1", "a", "vllm", 0, 1)); got != "GPU-4,GPU-5" {
		t.Fatalf("first runtime: %q", got)
	}

	first.Stop()
	mu.Lock()
	for _, c := range conns {
		_ = c.Close()
	}
	mu.Unlock()
	eventually(t, "not ready once the runtime is gone", func() bool { return !p.Ready() })

	running := ctr("a1", "a", "vllm")
	running.State = api.ContainerState_CONTAINER_RUNNING
	running.Annotations = map[string]string{n.PodAssignedGPUsAnnotation(): "4,5"}
	second := startRuntime(running)
	t.Cleanup(second.Stop)
	eventually(t, "ready with the restarted runtime", p.Ready)
	if got := create(second, envGiven("a2", "a", "vllm", 0, 1)); got != "GPU-6,GPU-7" {
		t.Fatalf("after the runtime restarted: %q; 4,5 are a1's", got)
	}
	if got := testutil.ToFloat64(m.Reconnects); got != 1 {
		t.Errorf("reconnects = %v, want 1", got)
	}
	select {
	case err := <-done:
		t.Fatalf("serve returned while the runtime was up: %v", err)
	default:
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve after cancel: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not return after its context ended")
	}
}

func TestFlags(t *testing.T) {
	cases := []struct {
		name       string
		args       []string
		strategies []string
		trusted    []string
		wantErr    string
		wantLog    string
	}{
		{name: "defaults", strategies: names.DefaultDeviceListStrategies, trusted: names.DefaultTrustedNamespaces},
		{name: "strategies and namespaces", args: []string{"--device-list-strategy=envvar, volume-mounts", "--trusted-namespaces=kube-system,nvdomain-system"},
			strategies: []string{"envvar", "volume-mounts"}, trusted: []string{"kube-system", "nvdomain-system"}},
		{name: "nothing trusted", args: []string{"--trusted-namespaces="}, strategies: names.DefaultDeviceListStrategies},
		{name: "an older release's --naming", args: []string{"--naming=uuid"}, strategies: names.DefaultDeviceListStrategies, trusted: names.DefaultTrustedNamespaces,
			wantLog: `"level"=0 "msg"="DEPRECATED: --naming is ignored and will be removed; GPUs are named as the device plugin named them" "naming"="uuid"`},
		{name: "unknown strategy", args: []string{"--device-list-strategy=cdi"}, wantErr: `--device-list-strategy: "cdi" is not one of envvar, volume-mounts, cdi-annotations, cdi-cri`},
		{name: "no strategy", args: []string{"--device-list-strategy="}, wantErr: "--device-list-strategy: give at least one"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("nvdomain-nri", flag.ContinueOnError)
			finish := BindFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			var logged bytes.Buffer
			log := funcr.New(func(prefix, args string) { logged.WriteString(args + "\n") }, funcr.Options{})
			o, err := finish(log)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(o.DeviceListStrategies, tc.strategies) || !slices.Equal(o.TrustedNamespaces, tc.trusted) {
				t.Errorf("strategies %v, trusted %v", o.DeviceListStrategies, o.TrustedNamespaces)
			}
			if got := strings.TrimSpace(logged.String()); got != tc.wantLog {
				t.Errorf("logged %q, want %q", got, tc.wantLog)
			}
		})
	}
}

// TestWaitForTopologyOutlastsAMissingSource: a node whose source yields nothing yet (here a
// topo-matrix file not written yet; on a GPU node NVML whose library the toolkit has not
// mounted) keeps the plugin waiting in-process, logging the error once, instead of exiting
// into a crash loop; it goes on as soon as the source yields a topology.
func TestWaitForTopologyOutlastsAMissingSource(t *testing.T) {
	fixture, err := os.ReadFile(filepath.Join("..", "pkg", "topology", "topomatrix", "testdata", "hgx-h100-8gpu.txt"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "topo.txt")
	var o RunOptions
	o.Topology.Source, o.Topology.TopoMatrixFile = names.SourceTopoMatrix, path
	var logged strings.Builder
	var mu sync.Mutex
	log := funcr.New(func(_, args string) { mu.Lock(); logged.WriteString(args + "\n"); mu.Unlock() }, funcr.Options{})
	go func() {
		time.Sleep(50 * time.Millisecond)
		os.WriteFile(path+".tmp", fixture, 0o644)
		os.Rename(path+".tmp", path)
	}()
	wctx, wcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer wcancel()
	top, err := waitForTopology(wctx, o, Backoff{Initial: 5 * time.Millisecond, Max: 10 * time.Millisecond}, log)
	if err != nil || top == nil || len(top.GPUs) != 8 {
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("waitForTopology: %v, %v; want the 8 GPUs of the file once it exists; log:\n%s", top, err, logged.String())
	}
	mu.Lock()
	defer mu.Unlock()
	if n := strings.Count(logged.String(), "no topology from the source yet"); n != 1 {
		t.Errorf("logged the same error %d times, want once:\n%s", n, logged.String())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	o.Topology.TopoMatrixFile = path + ".absent"
	if _, err := waitForTopology(ctx, o, Backoff{Initial: time.Millisecond, Max: time.Millisecond}, logr.Discard()); err == nil {
		t.Error("waitForTopology after ctx ended: nil error")
	}
}

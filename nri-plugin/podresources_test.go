package nriplugin

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/containerd/nri/pkg/api"

	"github.com/nvdomain/nvdomain/pkg/names"
)

// fakeKubelet is the kubelet's PodResources answer, by namespace/pod/container.
type fakeKubelet struct {
	allocated map[string][]string
	err       error
	asked     int
}

func (f *fakeKubelet) Allocated(_ context.Context, ns, pod, container string) ([]string, error) {
	f.asked++
	return f.allocated[ns+"/"+pod+"/"+container], f.err
}

// Under the envvar strategy a GPU list from envFrom or an image's ENV has the device plugin's
// form; the kubelet's PodResources API tells them apart. A container the kubelet allocated no
// GPU gets the variable set to void and books nothing; one it allocated GPUs to is rewritten
// into its domain; a kubelet that does not answer refuses the container; forms that need no
// answer are not asked.
func TestKubeletToldGPUListsFromTheDevicePlugin(t *testing.T) {
	envvar := func(c *Config) { c.DeviceListStrategies = []string{names.StrategyEnvVar} }
	plain := &api.PodSandbox{Id: "u", Name: "web", Namespace: "default"}
	for _, tc := range []struct {
		name      string
		kubelet   *fakeKubelet
		pod       *api.PodSandbox
		env       string
		wantGPUs  string // assigned-gpus; "" none
		wantEnv   string // the variable as adjusted; "" unchanged
		wantErr   string
		wantAsked int
	}{
		{"envFrom list in a container without a GPU request", &fakeKubelet{}, plain, "GPU-4,GPU-5", "", "void", "", 1},
		{"the device plugin's list", &fakeKubelet{allocated: map[string][]string{"default/pod-p/vllm": {"GPU-0", "GPU-1"}}}, pinnedPod("p", 1, `{"vllm":2}`), "GPU-0,GPU-1", "4,5", "GPU-4,GPU-5", "", 1},
		// Packed into the first free GPU, as every unpinned container is (account mode).
		{"an unpinned container the kubelet gave GPUs", &fakeKubelet{allocated: map[string][]string{"default/web/c": {"GPU-6"}}}, plain, "GPU-6", "0", "GPU-0", "", 1},
		{"the kubelet does not answer", &fakeKubelet{err: errors.New("connection refused")}, plain, "GPU-4", "", "", "PodResources", 1},
		{"all needs no answer", &fakeKubelet{}, plain, "all", "", "void", "", 0},
		{"void needs no answer", &fakeKubelet{}, plain, "void", "", "", "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, rec, _ := newPlugin(t, envvar, func(c *Config) { c.Allocations = tc.kubelet })
			name := "c"
			if tc.pod.Name == "pod-p" {
				name = "vllm"
			}
			adj, _, err := p.CreateContainer(context.Background(), tc.pod, ctr("c1", tc.pod.Id, name, "NVIDIA_VISIBLE_DEVICES="+tc.env))
			if tc.kubelet.asked != tc.wantAsked {
				t.Errorf("kubelet asked %d times, want %d", tc.kubelet.asked, tc.wantAsked)
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := adj.GetAnnotations()[n.PodAssignedGPUsAnnotation()]; got != tc.wantGPUs {
				t.Errorf("assigned %q, want %q", got, tc.wantGPUs)
			}
			if got := envOf(adj)[names.VisibleDevicesEnv]; got != tc.wantEnv {
				t.Errorf("NVIDIA_VISIBLE_DEVICES adjusted to %q, want %q", got, tc.wantEnv)
			}
			if tc.wantGPUs == "" && len(rec.latest) != 0 {
				t.Errorf("booked %+v", rec.latest)
			}
		})
	}
}

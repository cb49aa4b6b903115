package containerd

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	cdi "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nvdomain/nvdomain/pkg/cdispec"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/test/localcluster"
)

// The device plugin's answer for some GPUs of the seed node, in each of NVIDIA's device list
// strategies, as the kubelet hands it to containerd.
func devicePluginAnswer(strategy string, gpus ...int) ctrDevices {
	var ids []string
	for _, g := range gpus {
		ids = append(ids, fmt.Sprintf("GPU-seed-%d", g))
	}
	var cdiNames []string
	for _, id := range ids {
		cdiNames = append(cdiNames, cdispec.DevicePluginGPU.Device(id))
	}
	switch strategy {
	case names.StrategyCDICRI:
		return ctrDevices{cdi: cdiNames}
	case names.StrategyCDIAnnotations:
		return ctrDevices{annotations: map[string]string{names.DevicePluginCDIAnnotationKey + "4f2a": strings.Join(cdiNames, ",")}}
	case names.StrategyEnvVar:
		return ctrDevices{env: map[string]string{names.VisibleDevicesEnv: strings.Join(ids, ",")}}
	case names.StrategyVolumeMounts:
		d := ctrDevices{env: map[string]string{names.VisibleDevicesEnv: names.VolumeMountsDir}, mounts: map[string]string{}}
		for _, id := range ids {
			d.mounts[names.VolumeMountsDir+"/"+id] = "/dev/null"
		}
		return d
	}
	panic(strategy)
}

func requirePlugin(p podSpec, container string) podSpec {
	if p.annotations == nil {
		p.annotations = map[string]string{}
	}
	p.annotations[names.RequiredPluginsFor(container)] = `["` + names.NRIPluginName + `"]`
	return p
}

var gpuNode = regexp.MustCompile(`^nvidia[0-9]+$`)

// gpuNodes lists the GPU device nodes inside a running container.
func (n *node) gpuNodes(ctrID string) []string {
	n.t.Helper()
	var out []string
	for _, f := range strings.Fields(n.sh(ctrID, "ls /dev")) {
		if gpuNode.MatchString(f) {
			out = append(out, "/dev/"+f)
		}
	}
	slices.Sort(out)
	return out
}

// canOpen tells, from inside the container, whether GPU minor m is reachable: a GPU the
// container may use opens to ENXIO (the simulated GPU has no driver behind it), one it must
// not use is refused by the device cgroup (EPERM) even when a process makes the node again
// with mknod, which containers may do by default.
func (n *node) canOpen(ctrID string, m int) (bool, string) {
	return n.canOpenDevice(ctrID, names.GPUDeviceMajor, m)
}

// canOpenDevice is canOpen for any character device: it makes a node of that number and
// opens it. A number the cgroup allows opens to ENXIO or ENODEV (no driver, or no such DRM
// minor, behind it); one it denies fails with EPERM.
func (n *node) canOpenDevice(ctrID string, major, minor int) (bool, string) {
	out := n.sh(ctrID, fmt.Sprintf("p=/dev/probe-%d-%d; [ -e $p ] || mknod $p c %d %d; cat $p", major, minor, major, minor))
	switch {
	case strings.Contains(out, "No such device"):
		return true, out
	case strings.Contains(out, "Operation not permitted"):
		return false, out
	}
	n.t.Fatalf("opening device %d:%d said %q; expected ENXIO or ENODEV (allowed) or EPERM (denied)", major, minor, out)
	return false, out
}

// TestEveryDeviceListStrategyEndsWithExactlyTheDomainsGPUs: the device plugin chose GPUs 0,1
// (domain 0) and the pod is pinned to domain 1; whichever way the device plugin handed them
// over, the container ends with device nodes for GPUs 4 and 5 alone, can open those, and
// cannot open any other GPU, even by making its node. Under volume-mounts, whose mounts NRI
// cannot take away, a valid choice of the device plugin (4,5) stands and an invalid one (0,1)
// is refused with the reason.
func TestEveryDeviceListStrategyEndsWithExactlyTheDomainsGPUs(t *testing.T) {
	n := startNode(t)
	n.startPlugin()
	for _, strategy := range []string{names.StrategyCDICRI, names.StrategyCDIAnnotations, names.StrategyEnvVar, names.StrategyVolumeMounts} {
		t.Run(strategy, func(t *testing.T) {
			pod, cfg := n.runPod(requirePlugin(tpPod("tp2-"+strategy, 1, 2), "vllm"))
			defer func() {
				_, _ = n.crictl("stopp", pod)
				_, _ = n.crictl("rmp", pod)
			}()
			dp := []int{0, 1}
			if strategy == names.StrategyVolumeMounts {
				_, err := n.createContainerWith(pod, cfg, "vllm", devicePluginAnswer(strategy, dp...))
				if err == nil || !strings.Contains(err.Error(), "GPU 0 is not in NVSwitch domain 1") {
					t.Fatalf("volume-mounts choice outside the domain: %v", err)
				}
				dp = []int{4, 5}
			}
			id, err := n.createContainerWith(pod, cfg, "vllm", devicePluginAnswer(strategy, dp...))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := n.crictl("start", id); err != nil {
				t.Fatal(err)
			}
			if got := n.gpuNodes(id); !slices.Equal(got, []string{"/dev/nvidia4", "/dev/nvidia5"}) {
				t.Fatalf("GPU device nodes in the container: %v, want /dev/nvidia4 and /dev/nvidia5", got)
			}
			for m := range 8 {
				ok, out := n.canOpen(id, m)
				if want := m == 4 || m == 5; ok != want {
					t.Errorf("GPU %d reachable = %v, want %v (%s)", m, ok, want, out)
				}
			}
			t.Logf("%s: ls /dev → %v; GPU 0: %s", strategy, n.gpuNodes(id), strings.TrimSpace(n.sh(id, "mknod /dev/g0 c 195 0")))
		})
	}
}

// TestMIGDevicePassesUntouched: a container holding a MIG device keeps exactly what the
// device plugin gave it, and the plugin does not count it against whole GPUs.
func TestMIGDevicePassesUntouched(t *testing.T) {
	n := startNode(t)
	mig := cdispec.Kind{Vendor: names.DevicePluginCDIVendor, Class: names.CDIClassMIG}
	mode := os.FileMode(0o666)
	spec := &cdi.Spec{Version: cdispec.Version, Kind: mig.String(), Devices: []cdi.Device{{Name: "MIG-seed-0-1g", ContainerEdits: cdi.ContainerEdits{
		DeviceNodes: []*cdi.DeviceNode{cdispec.GPUNode(0), {Path: "/dev/nvidia-caps/nvidia-cap21", Type: "c", Major: 511, Minor: 21, FileMode: &mode}},
	}}}}
	if err := cdispec.Write(localcluster.CDISpecDir(n.dir), mig, spec); err != nil {
		t.Fatal(err)
	}
	n.startPlugin()
	pod, cfg := n.runPod(podSpec{name: "mig"})
	id, err := n.createContainerWith(pod, cfg, "cuda", ctrDevices{cdi: []string{mig.Device("MIG-seed-0-1g")}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.crictl("start", id); err != nil {
		t.Fatal(err)
	}
	if got := n.gpuNodes(id); !slices.Equal(got, []string{"/dev/nvidia0"}) {
		t.Fatalf("GPU nodes %v, want the MIG device's parent /dev/nvidia0 untouched", got)
	}
	if out := n.sh(id, "ls /dev/nvidia-caps"); !strings.Contains(out, "nvidia-cap21") {
		t.Fatalf("MIG capability node missing: %q", out)
	}
	// GPU 0 was not booked: a TP=4 in domain 0 still gets GPUs 0-3.
	tp, tcfg := n.runPod(tpPod("tp4", 0, 4))
	tid, err := n.createContainerWith(tp, tcfg, "vllm", ctrDevices{cdi: []string{cdispec.DevicePluginGPU.Device("GPU-seed-4"), cdispec.DevicePluginGPU.Device("GPU-seed-5"),
		cdispec.DevicePluginGPU.Device("GPU-seed-6"), cdispec.DevicePluginGPU.Device("GPU-seed-7")}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.crictl("start", tid); err != nil {
		t.Fatal(err)
	}
	if got := n.gpuNodes(tid); !slices.Equal(got, []string{"/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2", "/dev/nvidia3"}) {
		t.Fatalf("TP=4 in domain 0 got %v", got)
	}
}

// TestContainerRefusedWhileNRIPluginDownThenRuns: the webhook's required-plugins annotation
// makes containerd's NRI validator refuse a GPU container the plugin cannot see, with a
// message that names nvdomain; once the plugin is back the same container is created in its
// domain. A hand-written domain annotation on a pod that asked for no GPU gets none.
func TestContainerRefusedWhileNRIPluginDownThenRuns(t *testing.T) {
	n := startNode(t)
	pod, cfg := n.runPod(requirePlugin(tpPod("tp2", 1, 2), "vllm"))
	_, err := n.createContainerWith(pod, cfg, "vllm", devicePluginAnswer(names.StrategyCDICRI, 0, 1))
	// crictl prints the runtime's message with its quotes escaped.
	if err == nil || !strings.Contains(strings.ReplaceAll(err.Error(), `\"`, `"`), `rejected container adjustment, reason: validation error: required plugin "nvdomain" not present`) {
		t.Fatalf("create while the plugin is down: %v; want the validator's refusal naming nvdomain", err)
	}
	t.Logf("refused while the plugin is down: %v", err)
	n.startPlugin()
	id, err := n.createContainerWith(pod, cfg, "vllm", devicePluginAnswer(names.StrategyCDICRI, 0, 1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.crictl("start", id); err != nil {
		t.Fatal(err)
	}
	if got := n.gpuNodes(id); !slices.Equal(got, []string{"/dev/nvidia4", "/dev/nvidia5"}) {
		t.Fatalf("after the plugin came back: %v", got)
	}

	sneaky, scfg := n.runPod(podSpec{name: "sneaky", annotations: map[string]string{
		"gpu.nvidia.com/nvswitch-domain": "0", "gpu.nvidia.com/container-gpus": `{"main":4}`}})
	_, err = n.createContainerWith(sneaky, scfg, "main", ctrDevices{})
	if err == nil || !strings.Contains(err.Error(), "says 4 GPU(s) for this container but the device plugin allocated 0") {
		t.Fatalf("hand-annotated pod: %v", err)
	}
}

// TestEnvNamingGPUsIsNeutralisedUnderTheCDIStrategies: under the GPU Operator's default
// strategies, NVIDIA_VISIBLE_DEVICES that a pod sets itself is worth nothing: the container
// runs with void (the toolkit, which would have injected the GPUs it names, adds none) and
// books no GPU, so pinned pods are not locked out; in a trusted namespace it stays as it is.
func TestEnvNamingGPUsIsNeutralisedUnderTheCDIStrategies(t *testing.T) {
	n := startNode(t)
	n.startPlugin("--device-list-strategy", strings.Join(names.DefaultDeviceListStrategies, ","))
	var all []string
	for g := range 8 {
		all = append(all, fmt.Sprintf("GPU-seed-%d", g))
	}
	cases := []struct {
		pod      podSpec
		env      string
		wantEnv  string // "": refused
		wantGPUs int
	}{
		// This node's GPU ids in the envvar form while envvar is off: refused with the flag to
		// set (a device plugin running envvar would otherwise start pods without GPUs, silently).
		{podSpec{name: "greedy"}, strings.Join(all, ","), "", 0},
		{podSpec{name: "cuda-image"}, "all", "void", 0},
		// Left as it is in a trusted namespace: the toolkit gives it every GPU (the CDI spec's
		// "all" device).
		{podSpec{name: "dcgm-exporter", namespace: "gpu-operator"}, "all", "all", 8},
	}
	for _, tc := range cases {
		pod, cfg := n.runPod(tc.pod)
		id, err := n.createContainer(pod, cfg, "main", tc.env)
		if tc.wantEnv == "" {
			if err == nil || !strings.Contains(err.Error(), "node.agent.deviceListStrategy") {
				t.Fatalf("%s: %v, want a refusal naming node.agent.deviceListStrategy", tc.pod.name, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.pod.name, err)
		}
		if _, err := n.crictl("start", id); err != nil {
			t.Fatal(err)
		}
		if got := n.envOf(id, names.VisibleDevicesEnv); got != tc.wantEnv {
			t.Errorf("%s: NVIDIA_VISIBLE_DEVICES=%q inside, want %q", tc.pod.name, got, tc.wantEnv)
		}
		if got := n.gpuNodes(id); len(got) != tc.wantGPUs {
			t.Errorf("%s: GPU device nodes %v, want %d", tc.pod.name, got, tc.wantGPUs)
		}
	}
	for d := range 2 {
		pod, cfg := n.runPod(requirePlugin(tpPod(fmt.Sprint("tp4-", d), d, 4), "vllm"))
		if _, err := n.createContainerWith(pod, cfg, "vllm", devicePluginAnswer(names.StrategyCDICRI, 0, 1, 2, 3)); err != nil {
			t.Fatalf("TP=4 in domain %d beside the greedy pod: %v", d, err)
		}
	}
}

// TestPluginReconnectsAfterContainerdRestarts: containerd restarting closes the plugin's
// connection; the plugin process connects to the new containerd, which synchronizes it with
// the containers that kept running, and serves the next creation.
func TestPluginReconnectsAfterContainerdRestarts(t *testing.T) {
	n := startNode(t)
	n.startPlugin()
	pod, cfg := n.runPod(requirePlugin(tpPod("tp2-a", 1, 2), "vllm"))
	id, err := n.createContainerWith(pod, cfg, "vllm", devicePluginAnswer(names.StrategyCDICRI, 0, 1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.crictl("start", id); err != nil {
		t.Fatal(err)
	}
	n.stopContainerd()
	for _, sock := range []string{"nri.sock", "c.sock"} {
		_ = os.Remove(n.path(sock))
	}
	n.startContainerd()
	n.waitForRegistration()
	if err := n.plugin.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the plugin process is gone: %v", err)
	}
	pod2, cfg2 := n.runPod(requirePlugin(tpPod("tp2-b", 1, 2), "vllm"))
	id2, err := n.createContainerWith(pod2, cfg2, "vllm", devicePluginAnswer(names.StrategyCDICRI, 0, 1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.crictl("start", id2); err != nil {
		t.Fatal(err)
	}
	if got := n.gpuNodes(id2); !slices.Equal(got, []string{"/dev/nvidia6", "/dev/nvidia7"}) {
		t.Fatalf("after containerd restarted: %v; 4,5 are tp2-a's", got)
	}
}

// waitForLog waits until containerd's log holds at least count lines containing s.
func (n *node) waitForLog(s string, count int) {
	n.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for strings.Count(readFile(n.path("containerd.log")), s) < count {
		if time.Now().After(deadline) {
			n.t.Fatalf("containerd never logged %q %d times", s, count)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestContainerRefusedWhenThePluginHangsOrDiesMidCreate: NRI's adaptation counts a plugin
// as consulted before calling it, and closes one whose create request times out or whose
// connection drops, so the default validator alone lets such a container run with the device
// plugin's GPUs (0,1 here, outside the pod's domain 1). nvdomain's own validator refuses it:
// a plugin frozen past containerd's request timeout (SIGSTOP: slow, as under a CPU limit),
// and one killed while containerd waits for its answer. The refusal is NRI calling the closed
// plugin's validator, which fails: it names the plugin (a plugin without a validator would
// let the container through, as on today's containerd with the default validator alone).
// After each, the plugin (thawed, or started again) reconnects and the retried creation gets
// the domain's GPUs.
func TestContainerRefusedWhenThePluginHangsOrDiesMidCreate(t *testing.T) {
	n := startNode(t)
	n.startPlugin()
	for _, tc := range []struct {
		name    string
		failure func(pid, creates int)
		recover func()
		// want are the GPUs of the retry: the first case's container keeps 4,5, so the second
		// gets 6,7, which also shows that the refused creates left no GPU booked.
		want []string
	}{
		{"frozen past the request timeout", func(int, int) {}, func() {
			_ = n.plugin.Process.Signal(syscall.SIGCONT)
			n.waitForRegistration() // its connection was closed: it connects again in-process
		}, []string{"/dev/nvidia4", "/dev/nvidia5"}},
		{"killed mid-create", func(pid, creates int) {
			// containerd logs the creation before it asks the plugins; the frozen plugin cannot
			// answer, so once the line is there containerd is waiting for it.
			n.waitForLog("CreateContainer within sandbox", creates+1)
			time.Sleep(200 * time.Millisecond)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}, func() {
			_ = n.plugin.Wait()
			n.plugin = nil
			n.startPlugin()
		}, []string{"/dev/nvidia6", "/dev/nvidia7"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := strings.Fields(tc.name)[0]
			pod, cfg := n.runPod(requirePlugin(tpPod("tp2-"+name, 1, 2), "vllm"))
			pid := n.plugin.Process.Pid
			if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			creates := strings.Count(readFile(n.path("containerd.log")), "CreateContainer within sandbox")
			done := make(chan error, 1)
			start := time.Now()
			go func() {
				_, err := n.createContainerWith(pod, cfg, "vllm", devicePluginAnswer(names.StrategyCDICRI, 0, 1))
				done <- err
			}()
			tc.failure(pid, creates)
			err := <-done
			msg := strings.ReplaceAll(fmt.Sprint(err), `\"`, `"`)
			if err == nil || !strings.Contains(msg, `validator plugin 10-nvdomain failed`) {
				t.Fatalf("create with the plugin %s: %v; want the nvdomain validator's refusal", tc.name, err)
			}
			i := strings.Index(msg, "validator plugin")
			t.Logf("refused after %v: %s", time.Since(start).Round(time.Millisecond), msg[i:min(len(msg), i+160)])
			if out, _ := n.crictl("ps", "-a", "--name", "vllm", "--pod", pod, "-q"); out != "" {
				t.Fatalf("a container exists after the refusal: %s", out)
			}
			tc.recover()
			id, err := n.createContainerWith(pod, cfg, "vllm", devicePluginAnswer(names.StrategyCDICRI, 0, 1))
			if err != nil {
				t.Fatalf("retry after the plugin came back: %v", err)
			}
			if _, err := n.crictl("start", id); err != nil {
				t.Fatal(err)
			}
			if got := n.gpuNodes(id); !slices.Equal(got, tc.want) {
				t.Fatalf("after the plugin came back: %v, want %v", got, tc.want)
			}
		})
	}
}

package containerd

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

func tpPod(name string, domain, gpus int) podSpec {
	return podSpec{name: name,
		labels: map[string]string{"tensor-parallel": "true"},
		annotations: map[string]string{
			"gpu.nvidia.com/nvswitch-domain": fmt.Sprint(domain),
			"gpu.nvidia.com/container-gpus":  fmt.Sprintf(`{"vllm":%d}`, gpus),
		}}
}

// TestNRIPluginOnRealContainerd: the webhook's annotations on a pod sandbox make containerd,
// through the plugin, give the container GPUs of the pinned domain; a container that asks for
// more than its domain has free is not created; killing the plugin mid-run never leads to a
// GPU being given twice.
func TestNRIPluginOnRealContainerd(t *testing.T) {
	n := startNode(t)
	n.startPlugin()

	podA, cfgA := n.runPod(tpPod("tp2-a", 1, 2))
	ctrA, err := n.createContainer(podA, cfgA, "vllm", "GPU-seed-0,GPU-seed-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.crictl("start", ctrA); err != nil {
		t.Fatal(err)
	}
	got := n.envOf(ctrA, "NVIDIA_VISIBLE_DEVICES")
	if got != "GPU-seed-4,GPU-seed-5" {
		t.Fatalf("inside the container NVIDIA_VISIBLE_DEVICES=%q, want GPUs 4,5 of domain 1 (the device plugin had chosen GPU-seed-0,GPU-seed-1)", got)
	}
	t.Logf("crictl exec %s env: NVIDIA_VISIBLE_DEVICES=%s", ctrA[:12], got)

	podB, cfgB := n.runPod(tpPod("tp4-b", 1, 4))
	_, err = n.createContainer(podB, cfgB, "vllm", "GPU-seed-0,GPU-seed-1,GPU-seed-2,GPU-seed-3")
	want := "nvdomain: pod default/tp4-b container vllm: NVSwitch domain 1 (GPUs 4,5,6,7) has 2 free GPU(s), 4 requested; the GPUs in use there: 4 by default/tp2-a/vllm, 5 by default/tp2-a/vllm"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("create of a container over the domain's free GPUs: %v\nwant the plugin's message %q", err, want)
	}
	t.Logf("refused: %v", err)

	// kill -9 the plugin while tp2-a runs, start it again, create more.
	n.killPlugin()
	n.startPlugin()
	podC, cfgC := n.runPod(tpPod("tp2-c", 1, 2))
	ctrC, err := n.createContainer(podC, cfgC, "vllm", "GPU-seed-4,GPU-seed-5")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.crictl("start", ctrC); err != nil {
		t.Fatal(err)
	}
	if got := n.envOf(ctrC, "NVIDIA_VISIBLE_DEVICES"); got != "GPU-seed-6,GPU-seed-7" {
		t.Fatalf("after the plugin restart tp2-c got %q; GPUs 4,5 are still tp2-a's", got)
	}
	podD, cfgD := n.runPod(tpPod("tp1-d", 1, 1))
	if _, err := n.createContainer(podD, cfgD, "vllm", "GPU-seed-4"); err == nil {
		t.Fatal("domain 1 is full after the restart, but a container was created")
	}
	// Non-GPU containers pass untouched.
	podE, cfgE := n.runPod(podSpec{name: "web"})
	ctrE, err := n.createContainer(podE, cfgE, "nginx", "void")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.crictl("start", ctrE); err != nil {
		t.Fatal(err)
	}
	if got := n.envOf(ctrE, "NVIDIA_VISIBLE_DEVICES"); got != "void" {
		t.Fatalf("non-GPU container changed: %q", got)
	}
	// Stopping a pod frees its GPUs for the next one.
	if _, err := n.crictl("stopp", podA); err != nil {
		t.Fatal(err)
	}
	if _, err := n.crictl("rmp", podA); err != nil {
		t.Fatal(err)
	}
	podF, cfgF := n.runPod(tpPod("tp2-f", 1, 2))
	ctrF, err := n.createContainer(podF, cfgF, "vllm", "GPU-seed-0,GPU-seed-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.crictl("start", ctrF); err != nil {
		t.Fatal(err)
	}
	if got := n.envOf(ctrF, "NVIDIA_VISIBLE_DEVICES"); got != "GPU-seed-4,GPU-seed-5" {
		t.Fatalf("after removing tp2-a, tp2-f got %q", got)
	}
}

// BenchmarkContainerCreate measures `crictl create` on real containerd without the plugin and
// with it, in one run, and reports the ratio. Run with -benchtime=1x; each phase takes a
// fixed number of samples.
func BenchmarkContainerCreate(b *testing.B) {
	n := startNode(b)
	const samples = 25
	measure := func(tag string) []time.Duration {
		var lat []time.Duration
		for i := range samples {
			pod, cfg := n.runPod(tpPod(fmt.Sprintf("%s-%d", tag, i), 1, 1))
			start := time.Now()
			id, err := n.createContainer(pod, cfg, "vllm", "GPU-seed-0")
			lat = append(lat, time.Since(start))
			if err != nil {
				b.Fatal(err)
			}
			_, _ = n.crictl("rm", id)
			_, _ = n.crictl("stopp", pod)
			_, _ = n.crictl("rmp", pod)
		}
		slices.Sort(lat)
		return lat
	}
	for b.Loop() {
		without := measure("without")
		n.startPlugin()
		with := measure("with")
		n.killPlugin()
		p50w, p50o := with[samples/2], without[samples/2]
		b.ReportMetric(float64(p50o.Microseconds()), "p50-without-µs")
		b.ReportMetric(float64(p50w.Microseconds()), "p50-with-µs")
		b.ReportMetric(float64(without[samples-2].Microseconds()), "p95-without-µs")
		b.ReportMetric(float64(with[samples-2].Microseconds()), "p95-with-µs")
		b.ReportMetric(float64(p50w)/float64(p50o), "p50-ratio")
	}
}

// TestCrashLoopingTPContainerKeepsItsGPUs: a TP=4 container pinned to domain 1 exits and is
// created again twice, as the kubelet restarts a crash-looping container; during each
// back-off a plain 1-GPU container is created on the node, and during the second the plugin
// is killed and started again. The TP container gets GPUs 4-7
// back every time; the plain one never gets one of them (it is refused: every GPU is held,
// and the kubelet retries it), and runs once the TP pod has ended.
func TestCrashLoopingTPContainerKeepsItsGPUs(t *testing.T) {
	n := startNode(t)
	n.startPlugin()
	podA, cfgA := n.runPod(tpPod("tp4-a", 0, 4))
	ctrA, err := n.createContainer(podA, cfgA, "vllm", "GPU-seed-0,GPU-seed-1,GPU-seed-2,GPU-seed-3")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.crictl("start", ctrA); err != nil {
		t.Fatal(err)
	}
	podT, cfgT := n.runPod(tpPod("tp4-t", 1, 4))
	var ctrT string
	for attempt := 0; attempt < 3; attempt++ {
		if attempt > 0 {
			// The container exits; the kubelet waits before it creates the next one.
			if _, err := n.crictl("stop", ctrT); err != nil {
				t.Fatal(err)
			}
			if attempt == 2 {
				// The plugin restarts during this back-off (a DaemonSet rollout, say):
				// containerd lists no exited container to it, so the hold comes back from
				// its state file.
				n.killPlugin()
				n.startPlugin()
			}
			podP, cfgP := n.runPod(podSpec{name: fmt.Sprintf("plain-%d", attempt)})
			if ctrP, err := n.createContainer(podP, cfgP, "c", "GPU-seed-4"); err == nil {
				if _, err := n.crictl("start", ctrP); err != nil {
					t.Fatal(err)
				}
				t.Fatalf("back-off %d: a plain container was created with %s while the TP container's GPUs were held", attempt, n.envOf(ctrP, "NVIDIA_VISIBLE_DEVICES"))
			} else {
				t.Logf("back-off %d: plain container refused: %s", attempt, pluginMessage(err))
			}
			if _, err := n.crictl("stopp", podP); err != nil {
				t.Fatal(err)
			}
		}
		ctrT, err = n.createContainerWith(podT, cfgT, "vllm", ctrDevices{env: map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-seed-0,GPU-seed-1,GPU-seed-2,GPU-seed-3"}, attempt: attempt})
		if err != nil {
			t.Fatalf("attempt %d of the TP container refused: %v", attempt, err)
		}
		if _, err := n.crictl("start", ctrT); err != nil {
			t.Fatal(err)
		}
		if got := n.envOf(ctrT, "NVIDIA_VISIBLE_DEVICES"); got != "GPU-seed-4,GPU-seed-5,GPU-seed-6,GPU-seed-7" {
			t.Fatalf("attempt %d of the TP container got %q, want GPUs 4-7", attempt, got)
		}
	}
	// The TP pod ends while the plugin is down: the state file still says its container holds
	// GPUs 4-7, but its sandbox has stopped, so the restarted plugin keeps no hold for it and
	// the plain container gets a GPU.
	if _, err := n.crictl("stop", ctrT); err != nil {
		t.Fatal(err)
	}
	n.killPlugin()
	if _, err := n.crictl("stopp", podT); err != nil {
		t.Fatal(err)
	}
	n.startPlugin()
	podP, cfgP := n.runPod(podSpec{name: "plain-after"})
	ctrP, err := n.createContainer(podP, cfgP, "c", "GPU-seed-4")
	if err != nil {
		t.Fatalf("after the TP pod ended the plain container is still refused: %v", err)
	}
	if _, err := n.crictl("start", ctrP); err != nil {
		t.Fatal(err)
	}
}

// pluginMessage is the plugin's part of a refused create (crictl wraps it in its own logs).
func pluginMessage(err error) string {
	s := err.Error()
	if i := strings.Index(s, "nvdomain: "); i >= 0 {
		s = s[i:]
		if j := strings.IndexAny(s, "\"\n"); j >= 0 {
			s = s[:j]
		}
	}
	return s
}

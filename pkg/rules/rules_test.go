package rules

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvdomain/nvdomain/pkg/names"
)

var n = names.Default()

func container(name string, res map[string]int64, args ...string) corev1.Container {
	c := corev1.Container{Name: name, Image: "vllm/vllm-openai", Args: args, Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{}}}
	for k, v := range res {
		c.Resources.Limits[corev1.ResourceName(k)] = *resource.NewQuantity(v, resource.DecimalSI)
	}
	return c
}

func tpPod(containers ...corev1.Container) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "llama", Namespace: "default", Labels: map[string]string{"tensor-parallel": "true"}},
		Spec:       corev1.PodSpec{Containers: containers},
	}
}

func gpus(k int64) map[string]int64 { return map[string]int64{"nvidia.com/gpu": k} }

func check(t *testing.T, pod *corev1.Pod, largest int) []Violation {
	t.Helper()
	p := Inspect(pod, n)
	vs := ValidateTP(p, Config{Names: n, AllowedTPSizes: DefaultAllowedTPSizes}, func() int { return largest })
	return append(vs, ValidateDomains(pod, p, n)...)
}

func TestValidateTP(t *testing.T) {
	withEnv := container("vllm", gpus(2), "--tensor-parallel-size", "$(TP)")
	withEnv.Env = []corev1.EnvVar{{Name: "TP", Value: "4"}}
	fromSecret := container("vllm", gpus(2), "--tensor-parallel-size", "$(TP)")
	fromSecret.Env = []corev1.EnvVar{{Name: "TP", ValueFrom: &corev1.EnvVarSource{}}}
	shell := container("vllm", gpus(4))
	shell.Command = []string{"/bin/sh", "-c"}
	shell.Args = []string{`python3 -m vllm.entrypoints.openai.api_server --model "meta-llama/Llama-3-70B" --tensor-parallel-size 8 && sleep 1`}
	initGPU := tpPod(container("vllm", gpus(2)))
	initGPU.Spec.InitContainers = []corev1.Container{container("warmup", gpus(1))}
	sidecar := tpPod(container("vllm", gpus(2)))
	always := corev1.ContainerRestartPolicyAlways
	sc := container("proxy", gpus(2))
	sc.RestartPolicy = &always
	sidecar.Spec.InitContainers = []corev1.Container{sc}

	cases := []struct {
		name    string
		pod     *corev1.Pod
		largest int
		want    []string // exact "field: message" of each violation, in order
	}{
		{"valid TP=2", tpPod(container("vllm", gpus(2), "--model", "x", "--tensor-parallel-size", "2")), 4, nil},
		{"no GPU", tpPod(container("vllm", nil)), 4,
			[]string{"spec.containers: the pod is labelled tensor-parallel=true but no container requests nvidia.com/gpu; add nvidia.com/gpu: <GPUs> to resources.limits of the container that runs the engine, or remove the label"}},
		{"TP=3", tpPod(container("vllm", gpus(3))), 8,
			[]string{"spec.containers[0].resources.limits[nvidia.com/gpu]: tensor-parallel size 3 is not allowed (allowed: 2, 4, 8); request one of those GPU counts"}},
		{"TP=1", tpPod(container("vllm", gpus(1))), 4,
			[]string{"spec.containers[0].resources.limits[nvidia.com/gpu]: tensor-parallel size 1 is not allowed (allowed: 2, 4); request one of those GPU counts"}},
		{"TP=6 over two containers", tpPod(container("a", gpus(2)), container("b", gpus(4))), 0,
			[]string{"spec.containers[*].resources.limits[nvidia.com/gpu]: tensor-parallel size 6 (the sum over 2 containers) is not allowed (allowed: 2, 4, 8, 16, 32, 64, 128, 256); request one of those GPU counts"}},
		{"vLLM flag disagrees", tpPod(container("vllm", gpus(2), "--model", "m", "--tensor-parallel-size", "4")), 8,
			[]string{"spec.containers[0].args[2]: --tensor-parallel-size 4 disagrees with the container's 2 GPUs (nvidia.com/gpu: 2 in resources.limits); the engine would fail or leave GPUs idle, so set both to the same number"}},
		{"vLLM -tp=", tpPod(container("vllm", gpus(4), "-tp=2")), 8,
			[]string{"spec.containers[0].args[0]: -tp 2 disagrees with the container's 4 GPUs (nvidia.com/gpu: 4 in resources.limits); the engine would fail or leave GPUs idle, so set both to the same number"}},
		{"vLLM tp × pp matches", tpPod(container("vllm", gpus(8), "--tensor-parallel-size", "4", "--pipeline-parallel-size", "2")), 8, nil},
		{"SGLang tp × dp disagrees", tpPod(container("sglang", gpus(4), "--tp-size", "4", "--dp-size", "2")), 8,
			[]string{"spec.containers[0].args[0]: --tp-size 4 × --dp-size 2 (= 8 GPUs) disagrees with the container's 4 GPUs (nvidia.com/gpu: 4 in resources.limits); the engine would fail or leave GPUs idle, so set both to the same number"}},
		{"TensorRT-LLM", tpPod(container("trtllm", gpus(4), "serve", "--tp_size", "8")), 8,
			[]string{"spec.containers[0].args[1]: --tp_size 8 disagrees with the container's 4 GPUs (nvidia.com/gpu: 4 in resources.limits); the engine would fail or leave GPUs idle, so set both to the same number"}},
		{"flag inside sh -c", tpPod(shell), 8,
			[]string{"spec.containers[0].args[0]: --tensor-parallel-size 8 disagrees with the container's 4 GPUs (nvidia.com/gpu: 4 in resources.limits); the engine would fail or leave GPUs idle, so set both to the same number"}},
		{"env reference resolved", tpPod(withEnv), 8,
			[]string{"spec.containers[0].args[0]: --tensor-parallel-size 4 disagrees with the container's 2 GPUs (nvidia.com/gpu: 2 in resources.limits); the engine would fail or leave GPUs idle, so set both to the same number"}},
		{"env from a secret is not judged", tpPod(fromSecret), 8, nil},
		{"MIG", tpPod(container("vllm", map[string]int64{"nvidia.com/mig-3g.40gb": 2})), 8,
			[]string{"spec.containers[0].resources.limits[nvidia.com/mig-3g.40gb]: MIG instances have no NVLink between them, so a tensor-parallel pod cannot use them; request whole GPUs with nvidia.com/gpu, or remove the tensor-parallel=true label"}},
		{"time-sliced", tpPod(container("vllm", map[string]int64{"nvidia.com/gpu.shared": 2})), 8,
			[]string{"spec.containers[0].resources.limits[nvidia.com/gpu.shared]: time-sliced GPU replicas have no NVLink between them, so a tensor-parallel pod cannot use them; request whole GPUs with nvidia.com/gpu, or remove the tensor-parallel=true label"}},
		{"an init container with a GPU is allowed (it gets it from the pod's domain)", initGPU, 8, nil},
		{"a GPU sidecar counts toward the TP size", sidecar, 8, nil},
		{"LWS group: tp × pp over the group", inGroup(tpPod(container("vllm", gpus(4), "--tensor-parallel-size", "8", "--pipeline-parallel-size", "2")), 4, "0"), 8, nil},
		{"LWS group: per-pod engine", inGroup(tpPod(container("vllm", gpus(4), "--tensor-parallel-size", "4")), 4, "0"), 8, nil},
		{"LWS group: flags fit neither", inGroup(tpPod(container("vllm", gpus(4), "--tensor-parallel-size", "8")), 4, "0"), 8,
			[]string{"spec.containers[0].args[0]: --tensor-parallel-size 8 disagrees with the group's 4 pods × 4 GPUs (16 GPUs; leaderworkerset.sigs.k8s.io/size=4, nvidia.com/gpu: 4 in resources.limits) and with the container's own 4 GPUs; the engine would fail or leave GPUs idle, so set the flags to the group's GPUs, or change the group size or the GPUs per pod"}},
		{"LWS group of one is a pod", inGroup(tpPod(container("vllm", gpus(4), "--tensor-parallel-size", "8")), 1, "0"), 8,
			[]string{"spec.containers[0].args[0]: --tensor-parallel-size 8 disagrees with the container's 4 GPUs (nvidia.com/gpu: 4 in resources.limits); the engine would fail or leave GPUs idle, so set both to the same number"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			vs := check(t, tc.pod, tc.largest)
			var got []string
			for _, v := range vs {
				got = append(got, v.Error())
			}
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("got\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(tc.want, "\n  "))
			}
		})
	}
	if p := Inspect(sidecar, n); p.GPUs != 4 {
		t.Errorf("sidecar pod GPUs = %d, want 4", p.GPUs)
	}
}

func TestValidateDomains(t *testing.T) {
	pinned := func(res map[string]int64) *corev1.Pod { return tpPod(container("vllm", res)) }
	twoDomains := tpPod(container("a", map[string]int64{"nvidia.com/gpu": 2, "nvidia.com/nvswitch-domain-0": 2}),
		container("b", map[string]int64{"nvidia.com/gpu": 2, "nvidia.com/nvswitch-domain-1": 2}))
	wrongAnn := pinned(map[string]int64{"nvidia.com/gpu": 2, "nvidia.com/nvswitch-domain-1": 2})
	wrongAnn.Annotations = map[string]string{"gpu.nvidia.com/nvswitch-domain": "0"}
	wrongAffinity := pinned(map[string]int64{"nvidia.com/gpu": 2, "nvidia.com/nvswitch-domain-1": 2})
	wrongAffinity.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "gpu.nvidia.com/nvswitch-domain-0", Operator: corev1.NodeSelectorOpGt, Values: []string{"1"}}}}}}}}
	wrongSelector := pinned(map[string]int64{"nvidia.com/gpu": 2, "nvidia.com/nvswitch-domain-1": 2})
	wrongSelector.Spec.NodeSelector = map[string]string{"gpu.nvidia.com/nvswitch-domain-0": "4"}
	annOnly := pinned(gpus(2))
	annOnly.Annotations = map[string]string{"gpu.nvidia.com/nvswitch-domain": "1"}

	cases := []struct {
		name string
		pod  *corev1.Pod
		want string
	}{
		{"consistent hand-pinned pod", pinned(map[string]int64{"nvidia.com/gpu": 2, "nvidia.com/nvswitch-domain-1": 2}), ""},
		{"two domains", twoDomains, "spec.containers[1].resources.limits[nvidia.com/nvswitch-domain-1]: the pod names two NVSwitch domains (nvidia.com/nvswitch-domain-0 in spec.containers[0] and nvidia.com/nvswitch-domain-1 here), but all its GPUs must come from one; remove the hand-written nvidia.com/nvswitch-domain-* resources and let nvdomain choose"},
		{"count differs", pinned(map[string]int64{"nvidia.com/gpu": 4, "nvidia.com/nvswitch-domain-1": 2}),
			"spec.containers[0].resources.limits[nvidia.com/nvswitch-domain-1]: nvidia.com/nvswitch-domain-1: 2 does not match nvidia.com/gpu: 4 in the same container; the two counts must be equal (nvdomain adds the domain resource itself, so remove hand-written ones)"},
		{"annotation disagrees", wrongAnn, "metadata.annotations[gpu.nvidia.com/nvswitch-domain]: says domain 0 but the containers hold nvidia.com/nvswitch-domain-1; remove the annotation, nvdomain sets it"},
		{"affinity on another domain", wrongAffinity, "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0]: requires gpu.nvidia.com/nvswitch-domain-0 but the containers hold nvidia.com/nvswitch-domain-1; a pod's affinity and domain resources must name the same domain; remove the hand-written expression"},
		{"selector on another domain", wrongSelector, "spec.nodeSelector[gpu.nvidia.com/nvswitch-domain-0]: selects on domain 0 but the containers hold nvidia.com/nvswitch-domain-1; remove the selector, nvdomain adds the affinity itself"},
		{"annotation without resources", annOnly, "metadata.annotations[gpu.nvidia.com/nvswitch-domain]: says domain 1 but no container holds a nvidia.com/nvswitch-domain-<id> resource; remove the annotation, nvdomain sets it"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			vs := ValidateDomains(tc.pod, Inspect(tc.pod, n), n)
			got := ""
			if len(vs) > 0 {
				got = vs[0].Error()
			}
			if got != tc.want || len(vs) > 1 {
				t.Errorf("got %d violations, first:\n  %s\nwant\n  %s", len(vs), got, tc.want)
			}
		})
	}
}

func TestValidateNodeAffinity(t *testing.T) {
	withTerms := func(terms ...corev1.NodeSelectorTerm) *corev1.Pod {
		p := tpPod(container("vllm", gpus(4)))
		p.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: terms}}}
		return p
	}
	pool := corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "pool", Operator: corev1.NodeSelectorOpIn, Values: []string{"h100"}}}}
	byName := corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"gpu-node01"}}}}
	preferredOnly := tpPod(container("vllm", gpus(4)))
	preferredOnly.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{Weight: 1}}}}
	const fix = " empty, and an empty node-selector term matches no node, so this pod could never be scheduled; give %s term matchExpressions or matchFields that name the nodes you want, or remove requiredDuringSchedulingIgnoredDuringExecution"
	cases := []struct {
		name string
		pod  *corev1.Pod
		want string
	}{
		{"no affinity", tpPod(container("vllm", gpus(4))), ""},
		{"preferred terms only", preferredOnly, ""},
		{"an expression", withTerms(pool), ""},
		{"a field", withTerms(byName), ""},
		// Terms are ORed: the expression's term selects nodes, the empty one adds none.
		{"an empty term beside an expression", withTerms(corev1.NodeSelectorTerm{}, pool), ""},
		{"the only term empty", withTerms(corev1.NodeSelectorTerm{}),
			"spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0]: the only term is" + fmt.Sprintf(fix, "the")},
		{"every term empty", withTerms(corev1.NodeSelectorTerm{}, corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{}}),
			"spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms: all 2 terms are" + fmt.Sprintf(fix, "a")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			vs := ValidateNodeAffinity(tc.pod)
			got := ""
			if len(vs) > 0 {
				got = vs[0].Error()
				if vs[0].Reason != ReasonNoNodeSelected {
					t.Errorf("reason = %q", vs[0].Reason)
				}
			}
			if got != tc.want || len(vs) > 1 {
				t.Errorf("got %d violations, first:\n  %s\nwant\n  %s", len(vs), got, tc.want)
			}
		})
	}
}

func TestInspect(t *testing.T) {
	pod := tpPod(container("a", map[string]int64{"nvidia.com/gpu": 2, "nvidia.com/nvswitch-domain-1": 2, "nvidia.com/mig-1g.5gb": 1}), container("b", nil))
	p := Inspect(pod, n)
	if !p.TP || p.GPUs != 2 || p.PinnedDomain() != 1 || len(p.GPUContainers()) != 1 {
		t.Fatalf("inspect = %+v", p)
	}
	res := p.NVIDIAResources(n)
	if len(res) != 2 || res["nvidia.com/mig-1g.5gb"] != "spec.containers[0].resources.limits[nvidia.com/mig-1g.5gb]" {
		t.Errorf("NVIDIA resources = %v", res)
	}
	pod.Labels = nil
	if Inspect(pod, n).TP {
		t.Error("unlabelled pod inspected as TP")
	}
}

func TestShellWords(t *testing.T) {
	got := shellWords(`vllm serve "my model" --tp 2;echo 'a b' \"x`)
	want := []string{"vllm", "serve", "my model", "--tp", "2", "echo", "a b", `"x`}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("got %q", got)
	}
}

// The scheduler's count (k8s.io/component-helpers/resource.PodRequests), which the domain
// resource must equal, or the pod holds more or fewer GPUs of its domain than it is pinned to.
func TestDomainGPUsCountsAsTheScheduler(t *testing.T) {
	always := corev1.ContainerRestartPolicyAlways
	sidecar := func(name string, k int64) corev1.Container {
		c := container(name, gpus(k))
		c.RestartPolicy = &always
		return c
	}
	cases := []struct {
		name       string
		init, main []corev1.Container
		want       int
	}{
		{"containers add up", nil, []corev1.Container{container("a", gpus(2)), container("b", gpus(2))}, 4},
		{"a bigger init container", []corev1.Container{container("warm", gpus(8))}, []corev1.Container{container("a", gpus(4))}, 8},
		{"a sidecar runs beside the containers", []corev1.Container{sidecar("proxy", 2)}, []corev1.Container{container("a", gpus(4))}, 6},
		{"an init container after a sidecar runs beside it", []corev1.Container{sidecar("proxy", 2), container("warm", gpus(4))}, []corev1.Container{container("a", gpus(1))}, 6},
		{"an init container before the sidecar does not", []corev1.Container{container("warm", gpus(4)), sidecar("proxy", 2)}, []corev1.Container{container("a", gpus(1))}, 4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod := tpPod(tc.main...)
			pod.Spec.InitContainers = tc.init
			if got := Inspect(pod, n).DomainGPUs(); got != tc.want {
				t.Fatalf("DomainGPUs = %d, want %d", got, tc.want)
			}
		})
	}
}

// inGroup labels a pod as LeaderWorkerSet v0.8 labels group members.
func inGroup(pod *corev1.Pod, size int, worker string) *corev1.Pod {
	pod.Labels[names.LWSNameLabel] = "llama"
	pod.Labels[names.LWSGroupIndexLabel] = "0"
	pod.Labels[names.LWSWorkerIndexLabel] = worker
	pod.Annotations = map[string]string{names.LWSSizeAnnotation: strconv.Itoa(size)}
	return pod
}

func TestGroupOf(t *testing.T) {
	if g := Inspect(inGroup(tpPod(container("a", gpus(4))), 4, "0"), n).Group; g == nil || g.Key != "llama/0" || g.Size != 4 || !g.Leader {
		t.Errorf("leader's group = %+v", g)
	}
	if g := Inspect(inGroup(tpPod(container("a", gpus(4))), 4, "2"), n).Group; g == nil || g.Leader {
		t.Errorf("worker's group = %+v", g)
	}
	bad := inGroup(tpPod(container("a", gpus(4))), 4, "0")
	bad.Annotations[names.LWSSizeAnnotation] = "four"
	if g := Inspect(bad, n).Group; g != nil {
		t.Errorf("a size LWS never writes makes group %+v", g)
	}
	if g := Inspect(tpPod(container("a", gpus(4))), n).Group; g != nil {
		t.Errorf("a pod outside LWS has group %+v", g)
	}
}

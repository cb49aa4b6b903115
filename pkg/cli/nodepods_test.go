package cli

import (
	"context"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nvdomain/nvdomain/pkg/names"
)

func TestNodePodWarnings(t *testing.T) {
	gpuNode := func(name, arch string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"nvidia.com/gpu.present": "true", corev1.LabelArchStable: arch}}}
	}
	nodePod := func(node string, init bool, st corev1.ContainerStatus) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "nvdomain-node-" + node, Namespace: "nvdomain-system",
			Labels: map[string]string{"app.kubernetes.io/name": "nvdomain", "app.kubernetes.io/component": "node"}},
			Spec: corev1.PodSpec{NodeName: node}}
		if init {
			p.Status.InitContainerStatuses = []corev1.ContainerStatus{st}
		} else {
			p.Status.ContainerStatuses = []corev1.ContainerStatus{st}
		}
		return p
	}
	waiting := func(name, reason, msg string) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: name, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}}}
	}
	ds := func(archs ...string) *appsv1.DaemonSet {
		d := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "nvdomain-node", Namespace: "nvdomain-system",
			Labels: map[string]string{"app.kubernetes.io/name": "nvdomain", "app.kubernetes.io/component": "node"}}}
		if len(archs) > 0 {
			d.Spec.Template.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelArchStable, Operator: corev1.NodeSelectorOpIn, Values: archs}}}}}}}
		}
		return d
	}
	published := func(nd *corev1.Node) *corev1.Node {
		nd.Labels[names.Default().DomainCountLabel()] = "2"
		return nd
	}
	running := corev1.ContainerStatus{Name: "agent", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}
	crash := corev1.ContainerStatus{Name: "install-hook", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
		LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Message: `exec: "/nvdomain": exec format error`}}}
	for _, tc := range []struct {
		name    string
		objects []runtime.Object
		want    []string // each must appear in one warning, in order
	}{
		{"running node pods: nothing", []runtime.Object{gpuNode("a", "amd64"), ds("amd64", "arm64"), nodePod("a", false, running)}, nil},
		{"a mirror without arm64", []runtime.Object{gpuNode("gb200-1", "arm64"), ds("amd64", "arm64"),
			nodePod("gb200-1", true, waiting("enable-nri", "ErrImagePull", `failed to pull and unpack image "mirror.corp/nvdomain:v1": no match for platform in manifest: not found`))},
			[]string{"node gb200-1 (linux/arm64)", "no match for platform", "the image lacks linux/arm64", "node.architectures"}},
		{"binaries of another architecture", []runtime.Object{gpuNode("gh200-1", "arm64"), ds("amd64", "arm64"), nodePod("gh200-1", true, crash)},
			[]string{"node gh200-1 (linux/arm64)", "exec format error", "the image lacks linux/arm64"}},
		{"a wrong pull secret", []runtime.Object{gpuNode("h100-1", "amd64"), ds("amd64", "arm64"),
			nodePod("h100-1", false, waiting("agent", "ImagePullBackOff", "401 Unauthorized"))},
			[]string{"node h100-1 (linux/amd64)", "401 Unauthorized", "imagePullSecrets"}},
		{"an architecture left out", []runtime.Object{gpuNode("a", "amd64"), gpuNode("p9", "ppc64le"), ds("amd64", "arm64"), nodePod("a", false, running)},
			[]string{"p9 (ppc64le) get no nvdomain node pod", "node.architectures is [amd64, arm64]"}},
		{"no architecture requirement: no node is left out", []runtime.Object{gpuNode("p9", "ppc64le"), ds()}, nil},
		{"domains left behind by a node pod that is gone", []runtime.Object{published(gpuNode("gh200-2", "arm64")), ds("amd64")},
			[]string{"node(s) gh200-2 carry nvdomain's domain labels", "run no nvdomain node pod"}},
		{"a node without the GPU label: its platform unnamed", []runtime.Object{&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, ds("amd64", "arm64"),
			nodePod("x", false, waiting("agent", "ErrImagePull", "no match for platform in manifest"))},
			[]string{"node x (the node's platform)", "the image lacks the node's platform"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var nodes []corev1.Node
			for _, o := range tc.objects {
				if nd, ok := o.(*corev1.Node); ok {
					nodes = append(nodes, *nd)
				}
			}
			got := nodePodWarnings(context.Background(), fake.NewClientset(tc.objects...), names.Default(), nodes, func(string) bool { return true })
			if len(tc.want) == 0 {
				if len(got) != 0 {
					t.Fatalf("warnings %q, want none", got)
				}
				return
			}
			if len(got) != 1 {
				t.Fatalf("warnings %q, want one", got)
			}
			rest := got[0]
			for _, w := range tc.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("warning %q: want %q (after the earlier parts)", got[0], w)
				}
				rest = rest[i+len(w):]
			}
		})
	}
}

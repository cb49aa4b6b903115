package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/topology"
)

var nm = names.Default()

// fakeFactory hands the commands a fake clientset. It registers -n itself so that tests can
// tell an explicit namespace from the default, as KubeFlags does through the kubeconfig.
type fakeFactory struct {
	client kubernetes.Interface
	ns     string
}

func (f *fakeFactory) AddFlags(fs *pflag.FlagSet) {
	fs.StringVarP(&f.ns, "namespace", "n", "", "namespace")
}

func (f *fakeFactory) Client() (kubernetes.Interface, error) { return f.client, nil }

func (f *fakeFactory) Namespace() (string, bool, error) {
	if f.ns != "" {
		return f.ns, true, nil
	}
	return "default", false, nil
}

// runFake runs the command tree against a fake clientset holding objs.
func runFake(t *testing.T, stdin string, objs []runtime.Object, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	f := &fakeFactory{client: fake.NewClientset(objs...)}
	code = run(context.Background(), CommandName, args, IOStreams{In: strings.NewReader(stdin), Out: &out, ErrOut: &errb}, f)
	return code, out.String(), errb.String()
}

type nodeOpt func(*corev1.Node)

func withLabel(k, v string) nodeOpt { return func(n *corev1.Node) { n.Labels[k] = v } }

func cordoned(n *corev1.Node) { n.Spec.Unschedulable = true }

// failClosed sets the node's NvdomainFailClosed condition, as the agent's canary does.
func failClosed(status corev1.ConditionStatus) nodeOpt {
	return func(n *corev1.Node) {
		n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: names.ConditionFailClosed, Status: status})
	}
}

// withMinors publishes the agent's topology annotation, with each GPU's device minor.
func withMinors(t *testing.T, domains [][]int, minor func(int) int) nodeOpt {
	return func(n *corev1.Node) {
		var gpus []topology.GPU
		for _, d := range domains {
			for _, g := range d {
				m := minor(g)
				gpus = append(gpus, topology.GPU{Index: g, Minor: &m})
			}
		}
		top, err := topology.FromDomains(names.SourceSimulated, gpus, domains, nil)
		if err != nil {
			t.Fatal(err)
		}
		doc, err := json.Marshal(top)
		if err != nil {
			t.Fatal(err)
		}
		n.Annotations[nm.TopologyAnnotation()] = string(doc)
	}
}

// gpuNode publishes domains the way the agent does: size labels, GPU-list annotations and
// one allocatable resource per domain.
func gpuNode(name string, domains [][]int, opts ...nodeOpt) *corev1.Node {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"kubernetes.io/hostname": name}, Annotations: map[string]string{}},
		Status: corev1.NodeStatus{
			Allocatable: corev1.ResourceList{},
			Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
		},
	}
	total := 0
	for id, gpus := range domains {
		n.Labels[nm.DomainSizeLabel(id)] = fmt.Sprint(len(gpus))
		n.Annotations[nm.DomainGPUsAnnotation(id)] = names.FormatGPUList(gpus)
		n.Status.Allocatable[corev1.ResourceName(nm.DomainResource(id))] = *resource.NewQuantity(int64(len(gpus)), resource.DecimalSI)
		total += len(gpus)
	}
	if total > 0 {
		n.Status.Allocatable[names.GPUResource] = *resource.NewQuantity(int64(total), resource.DecimalSI)
	}
	for _, o := range opts {
		o(n)
	}
	n.Status.Capacity = n.Status.Allocatable
	return n
}

type podOpt func(*corev1.Pod)

// inLWSGroup makes the pod a member (worker index worker) of LeaderWorkerSet llama's group 0
// of 2, pinned to clique rack-a.0 as nvdomain's webhook pins it.
func inLWSGroup(worker string) podOpt {
	return func(p *corev1.Pod) {
		p.Labels[names.LWSNameLabel], p.Labels[names.LWSGroupIndexLabel], p.Labels[names.LWSWorkerIndexLabel] = "llama", "0", worker
		p.Annotations[names.LWSSizeAnnotation], p.Annotations[nm.PodCliqueAnnotation()] = "2", "rack-a.0"
	}
}

func inNamespace(ns string) podOpt { return func(p *corev1.Pod) { p.Namespace = ns } }

func boundTo(node string, phase corev1.PodPhase) podOpt {
	return func(p *corev1.Pod) { p.Spec.NodeName, p.Status.Phase = node, phase }
}

func unschedulable(p *corev1.Pod) {
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable,
		Message: "0/2 nodes are available: 2 Insufficient nvidia.com/nvswitch-domain-0."}}
}

func deleting(p *corev1.Pod) {
	now := metav1.Now()
	p.DeletionTimestamp, p.Finalizers = &now, []string{"example.com/hold"}
}

func ownedBy(kind, apiVersion, name string) podOpt {
	return func(p *corev1.Pod) {
		yes := true
		p.OwnerReferences = []metav1.OwnerReference{{Kind: kind, APIVersion: apiVersion, Name: name, UID: types.UID(name + "-uid"), Controller: &yes}}
	}
}

func createdAgo(d time.Duration) podOpt {
	return func(p *corev1.Pod) { p.CreationTimestamp = metav1.NewTime(time.Now().Add(-d)) }
}

func withAnnotation(k, v string) podOpt { return func(p *corev1.Pod) { p.Annotations[k] = v } }

// tpPod is a tensor-parallel pod of one container pinned to domain d (d < 0: not pinned), as
// the webhook leaves it; unbound and Pending unless an option says otherwise.
func tpPod(name string, gpus int64, d int, opts ...podOpt) *corev1.Pod {
	lim := corev1.ResourceList{names.GPUResource: *resource.NewQuantity(gpus, resource.DecimalSI)}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name), CreationTimestamp: metav1.NewTime(time.Now().Add(-time.Hour)),
			Labels: map[string]string{names.TPLabel: names.TPLabelValue}, Annotations: map[string]string{}},
		Spec:   corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai", Resources: corev1.ResourceRequirements{Limits: lim}}}},
		Status: corev1.PodStatus{Phase: corev1.PodPending},
	}
	if d >= 0 {
		lim[corev1.ResourceName(nm.DomainResource(d))] = *resource.NewQuantity(gpus, resource.DecimalSI)
		p.Annotations[nm.PodDomainAnnotation()] = fmt.Sprint(d)
		p.Annotations[nm.PodTPSizeAnnotation()] = fmt.Sprint(gpus)
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

// podEvent is an Event as the NRI plugin or the re-pin controller records it on a pod.
func podEvent(p *corev1.Pod, reason, from, msg string, ago time.Duration) *corev1.Event {
	t := metav1.NewTime(time.Now().Add(-ago))
	return &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("%s.%s", p.Name, strings.ToLower(reason)), Namespace: p.Namespace},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: p.Namespace, Name: p.Name, UID: p.UID},
		Reason:         reason, Message: msg, Type: corev1.EventTypeNormal, Source: corev1.EventSource{Component: from},
		FirstTimestamp: t, LastTimestamp: t,
	}
}

func job(name string, ignoreDisruption bool) *batchv1.Job {
	j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(name + "-uid")}}
	if ignoreDisruption {
		j.Spec.PodFailurePolicy = &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{{
			Action:          batchv1.PodFailurePolicyActionIgnore,
			OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{Type: corev1.DisruptionTarget}},
		}}}
	}
	return j
}

// replicaSet is the ReplicaSet ownedBy names, controlled by owner when one is given.
func replicaSet(name string, owner ...metav1.OwnerReference) *appsv1.ReplicaSet {
	return &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(name + "-uid"), OwnerReferences: owner}}
}

func resourceQty(v int64) *resource.Quantity { return resource.NewQuantity(v, resource.DecimalSI) }

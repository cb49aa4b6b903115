package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/nvdomain/nvdomain/pkg/admission"
	"github.com/nvdomain/nvdomain/pkg/clusterview"
	"github.com/nvdomain/nvdomain/pkg/names"
)

// manifestPod is one pod a manifest would create: a Pod, or a workload's pod template. skip
// says why a document yields no pod.
type manifestPod struct {
	what string
	pod  *corev1.Pod
	skip string
}

// podsFromManifests reads every document of a YAML or JSON file (and the items of a List) and
// turns each into the pod the apiserver would admit. Objects without a namespace take the
// command's (-n, else the kubeconfig context's), as kubectl apply does.
func podsFromManifests(data []byte, source, namespace string) ([]manifestPod, error) {
	var out []manifestPod
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for doc := 1; ; doc++ {
		var raw runtime.RawExtension
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, fmt.Errorf("%s: document %d is not YAML or JSON: %w", source, doc, err)
		}
		if t := bytes.TrimSpace(raw.Raw); len(t) == 0 || string(t) == "null" {
			continue
		}
		items, err := fromDocument(raw.Raw, namespace)
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", source, doc, err)
		}
		out = append(out, items...)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s holds no Kubernetes object: give a Pod, or a Deployment, StatefulSet, ReplicaSet, Job or CronJob manifest", source)
	}
	return out, nil
}

func fromDocument(raw []byte, namespace string) ([]manifestPod, error) {
	var tm metav1.TypeMeta
	if err := json.Unmarshal(raw, &tm); err != nil {
		return nil, fmt.Errorf("not a Kubernetes object: %w", err)
	}
	if tm.Kind == "" || tm.APIVersion == "" {
		return nil, fmt.Errorf("apiVersion and kind are missing; every manifest needs both, e.g. apiVersion: v1, kind: Pod")
	}
	if tm.Kind == "List" {
		var list corev1.List
		if err := json.Unmarshal(raw, &list); err != nil {
			return nil, fmt.Errorf("read the items of a List: %w", err)
		}
		var out []manifestPod
		for i, it := range list.Items {
			items, err := fromDocument(it.Raw, namespace)
			if err != nil {
				return nil, fmt.Errorf("items[%d]: %w", i, err)
			}
			out = append(out, items...)
		}
		return out, nil
	}
	var id struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
	}
	if err := json.Unmarshal(raw, &id); err != nil {
		return nil, fmt.Errorf("%s: metadata: %w", tm.Kind, err)
	}
	ns := id.Metadata.Namespace
	if ns == "" {
		ns = namespace
	}
	what := fmt.Sprintf("%s %s/%s", tm.Kind, ns, id.Metadata.Name)
	obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(raw, nil, nil)
	if runtime.IsNotRegisteredError(err) {
		return []manifestPod{{what: what, skip: "not a Pod and has no pod template"}}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	tmpl, pod := objectPod(obj)
	switch {
	case pod != nil:
		pod = pod.DeepCopy()
	case tmpl != nil:
		what += " (pod template)"
		pod = &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{GenerateName: id.Metadata.Name + "-", Labels: tmpl.Labels, Annotations: tmpl.Annotations},
			Spec:       *tmpl.Spec.DeepCopy(),
		}
	default:
		return []manifestPod{{what: what, skip: "not a Pod and has no pod template"}}, nil
	}
	pod.Namespace = ns
	return []manifestPod{{what: what, pod: pod}}, nil
}

// objectPod returns an object's pod, or the pod template it creates pods from.
func objectPod(obj runtime.Object) (*corev1.PodTemplateSpec, *corev1.Pod) {
	switch o := obj.(type) {
	case *corev1.Pod:
		return nil, o
	case *appsv1.Deployment:
		return &o.Spec.Template, nil
	case *appsv1.StatefulSet:
		return &o.Spec.Template, nil
	case *appsv1.ReplicaSet:
		return &o.Spec.Template, nil
	case *appsv1.DaemonSet:
		return &o.Spec.Template, nil
	case *batchv1.Job:
		return &o.Spec.Template, nil
	case *batchv1.CronJob:
		return &o.Spec.JobTemplate.Spec.Template, nil
	case *corev1.ReplicationController:
		return o.Spec.Template, nil
	case *corev1.PodTemplate:
		return &o.Template, nil
	}
	return nil, nil
}

// explainManifestPod runs the webhook's own handlers' decisions on one pod, in the order the
// apiserver calls them (mutating, then validating the mutated pod), and reports whether the
// pod would be denied.
func (o *ExplainOptions) explainManifestPod(s *snapshot, mp manifestPod) bool {
	fmt.Fprintf(o.Out, "%s:\n", mp.what)
	if mp.skip != "" {
		fmt.Fprintf(o.Out, "  skipped: %s\n", mp.skip)
		return false
	}
	decider := &admission.Decider{View: s.view, Options: o.admission}
	judged, plan := decider.Mutate(mp.pod, 0)
	if judged == nil {
		judged = mp.pod
	}
	violations, warnings := decider.Review(judged)

	tw := tabwriter.NewWriter(o.Out, 0, 4, 2, ' ', 0)
	kv := keyValues(tw)
	switch p := plan.Pod; {
	case p.TP:
		kv("  Tensor-parallel", "yes, %d GPUs", p.GPUs)
	case p.GPUs > 0:
		kv("  Tensor-parallel", "no; %d %s", p.GPUs, plural(p.GPUs, "GPU", "GPUs"))
	default:
		kv("  Tensor-parallel", "no; no %s", names.GPUResource)
	}
	kv("  Mutating webhook", "%s", o.describePlan(s, mp.pod, judged, plan))
	if len(violations) == 0 {
		kv("  Validating webhook", "admits it")
	} else {
		kv("  Validating webhook", "denies it, %d %s:", len(violations), plural(len(violations), "violation", "violations"))
	}
	_ = tw.Flush()
	for _, v := range violations {
		fmt.Fprintf(o.Out, "    - %s\n", v.Error())
	}
	if len(warnings) > 0 {
		fmt.Fprintf(o.Out, "  Warnings (%d):\n", len(warnings))
		for _, w := range warnings {
			fmt.Fprintf(o.Out, "    - %s\n", w.Text)
		}
	}
	return len(violations) > 0
}

// describePlan puts the mutating webhook's decision in words.
func (o *ExplainOptions) describePlan(s *snapshot, pod, pinned *corev1.Pod, plan admission.PinPlan) string {
	k := plan.Pod.GPUs
	switch plan.Outcome {
	case admission.OutcomeExcluded:
		return fmt.Sprintf("leaves it alone: namespace %s is excluded (the webhook's --exclude-namespaces)", pod.Namespace)
	case admission.OutcomeNoGPU:
		return fmt.Sprintf("leaves it unchanged: it asks for no %s", names.GPUResource)
	case admission.OutcomeNonTPUnpinned:
		if o.admission.NonTPPods == admission.NonTPAuto {
			return "leaves it unpinned: it is not tensor-parallel, and --non-tp-pods=auto pins such pods only while every GPU node has NVLink domains, which is not so now"
		}
		return fmt.Sprintf("leaves it unpinned: it is not tensor-parallel and --non-tp-pods=%s", o.admission.NonTPPods)
	case admission.OutcomeInvalid:
		return "leaves it unchanged, for the validating webhook to deny"
	case admission.OutcomeNoDomain:
		if plan.Pod.TP {
			return fmt.Sprintf("cannot pin it: %v", plan.Err)
		}
		return fmt.Sprintf("leaves it unpinned: %v; it may run on any node with %d free GPUs", plan.Err, k)
	}
	d := plan.Domain
	node, free := roomFor(s, pinned, d, k)
	switch {
	case !plan.Chosen && node != "":
		return fmt.Sprintf("keeps domain %d, which its own %s resources name; node %s has room now (%d GPUs free there)", d, o.admission.Names.DomainResource(d), node, free)
	case !plan.Chosen:
		return fmt.Sprintf("keeps domain %d, which its own %s resources name; no node it may run on has %d free GPUs there now, so it would wait Pending", d, o.admission.Names.DomainResource(d), k)
	case plan.Decision.Fits && node != "":
		return fmt.Sprintf("pins it to domain %d (%s: %d); node %s has room now (%d GPUs free there)", d, o.admission.Names.DomainResource(d), k, node, free)
	case plan.Decision.Fits:
		return fmt.Sprintf("pins it to domain %d (%s: %d), which has room now", d, o.admission.Names.DomainResource(d), k)
	}
	return fmt.Sprintf("pins it to domain %d (%s: %d), the id with the most GPUs on the nodes it may run on; none has %d free GPUs there now, so it would wait Pending until they free up",
		d, o.admission.Names.DomainResource(d), k, k)
}

// roomFor finds the node the pod may run on whose domain d has room for k GPUs and leaves the
// fewest free (the webhook's tightest fit), with that domain's free GPUs; "" when none has.
func roomFor(s *snapshot, pinned *corev1.Pod, d, k int) (string, int) {
	rooms, waiters := s.view.RepinInputs([]clusterview.WaitingPod{{Pod: pinned}})
	if len(waiters) != 1 {
		return "", 0
	}
	type cand struct {
		node string
		free int
	}
	var cs []cand
	for _, i := range waiters[0].Eligible {
		if f := rooms[i].Free[d]; f >= k {
			cs = append(cs, cand{rooms[i].Name, f})
		}
	}
	if len(cs) == 0 {
		return "", 0
	}
	sort.Slice(cs, func(i, j int) bool {
		if cs[i].free != cs[j].free {
			return cs[i].free < cs[j].free
		}
		return cs[i].node < cs[j].node
	})
	return cs[0].node, cs[0].free
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/nvdomain/nvdomain/pkg/kubeevents"
	"github.com/nvdomain/nvdomain/pkg/lifecycle"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/nristate"
)

// CanaryPlugin is the NRI plugin the canary requires; no plugin has this name, so an active
// validator must refuse the canary's container.
const CanaryPlugin = "nvdomain-canary-absent"

// CanaryOptions configure the fail-closed canary. nvdomain's guarantee on a node rests on
// containerd settings nothing else checks (NRI enabled, its default validator on, the snippet
// actually imported): without them a GPU container whose pod requires the NRI plugin starts
// anyway, on whatever GPUs the device plugin chose. The canary asks the node itself: a pod
// bound to it whose container requires a plugin that does not exist must be refused.
type CanaryOptions struct {
	// Image runs the canary (the release image: already on the node, and its /nvdomain
	// version exits at once should a broken node let it run). Empty disables the canary.
	Image string
	// Namespace and NamePrefix place the canary pod: the node pod's namespace, and
	// <release>-canary-, the only pods the node's credentials may create (policies.yaml);
	// ServiceAccount (<release>-canary) has no RBAC.
	Namespace, NamePrefix, ServiceAccount string
	// Interval between canaries (the first runs once the topology is published); Timeout is
	// how long one may take to be decided.
	Interval, Timeout time.Duration
	// WithholdCapacity publishes every domain with no room on a node not proven fail-closed
	// (no canary refused yet, or the last one started), so no tensor-parallel pod is placed
	// there (node.requireFailClosed).
	WithholdCapacity bool
	// PullSecrets are the release's imagePullSecrets: the canary runs the release image, which
	// a private registry serves only with them (the kubelet checks pull credentials for every
	// pod under KubeletEnsureSecretPulledImages, on by default from 1.35, even for an image
	// already on the node). The node-scope policy admits exactly these names.
	PullSecrets []string
}

// pullReasons are the kubelet's waiting reasons for an image it cannot get.
var pullReasons = map[string]bool{"ErrImagePull": true, "ImagePullBackOff": true, "InvalidImageName": true, "ErrImageNeverPull": true, "RegistryUnavailable": true}

// IsImagePullReason says whether a container's waiting reason is the kubelet's for an image it
// cannot get (the canary's, and kubectl nvdomain status's for the node pods).
func IsImagePullReason(reason string) bool { return pullReasons[reason] }

// CanaryResult is one canary's verdict, as the NvdomainFailClosed condition says it.
type CanaryResult struct {
	Status          corev1.ConditionStatus
	Reason, Message string
}

// CanaryName is the canary pod's name on a node: the prefix and the node's name, cut to fit
// a pod name with a hash of the full name so that two long node names never collide.
func CanaryName(prefix, node string) string {
	name := prefix + node
	if len(name) <= 63 {
		return name
	}
	sum := sha256.Sum256([]byte(node))
	return strings.TrimRight(name[:63-11], "-.") + "-" + hex.EncodeToString(sum[:])[:10]
}

// CanaryPod is the pod the node-scope policy lets a node pod create: one container running
// /nvdomain version, no volumes, no service account token, bound to the node.
func CanaryPod(o CanaryOptions, node string) *corev1.Pod {
	var secrets []corev1.LocalObjectReference
	for _, s := range o.PullSecrets {
		secrets = append(secrets, corev1.LocalObjectReference{Name: s})
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: CanaryName(o.NamePrefix, node), Namespace: o.Namespace,
			Labels: map[string]string{"app.kubernetes.io/name": "nvdomain", "app.kubernetes.io/component": "canary"},
			Annotations: map[string]string{
				names.RequiredPluginsAnnotation + names.RequiredPluginsContainerInfix + "canary": "[" + CanaryPlugin + "]",
			},
		},
		Spec: corev1.PodSpec{
			NodeName: node, HostNetwork: true, RestartPolicy: corev1.RestartPolicyNever, ImagePullSecrets: secrets,
			ServiceAccountName: o.ServiceAccount, AutomountServiceAccountToken: ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers: []corev1.Container{{
				Name: "canary", Image: o.Image, ImagePullPolicy: corev1.PullIfNotPresent, Command: []string{"/nvdomain", "version"},
				// No CPU request: on a node whose TP pods request every CPU, the kubelet would
				// reject the canary (OutOfcpu) before any container is created.
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("32Mi")}},
				SecurityContext: &corev1.SecurityContext{
					RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65532), AllowPrivilegeEscalation: ptr.To(false),
					ReadOnlyRootFilesystem: ptr.To(true), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}
}

// RunCanary creates the canary pod on node, waits until the kubelet's container creation is
// decided, deletes the pod and says what it proved.
func RunCanary(ctx context.Context, a *Agent) CanaryResult {
	if r := a.runtimeVerdict(); r != nil {
		return *r
	}
	o, c := a.o.Canary, a.o.Client
	pods := c.CoreV1().Pods(o.Namespace)
	pod := CanaryPod(o, a.o.Node)
	// A canary left by an agent that was killed mid-run is replaced.
	_ = pods.Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	deadline := time.Now().Add(o.Timeout)
	var err error
	for {
		if _, err = pods.Create(ctx, pod, metav1.CreateOptions{}); !apierrors.IsAlreadyExists(err) || time.Now().After(deadline) {
			break
		}
		if !lifecycle.Sleep(ctx, time.Second) {
			return CanaryResult{Status: corev1.ConditionUnknown, Reason: "CanaryInterrupted", Message: "the agent stopped during the canary"}
		}
	}
	if err != nil {
		return CanaryResult{Status: corev1.ConditionUnknown, Reason: names.ReasonCanaryNotCreated,
			Message: fmt.Sprintf("create canary pod %s/%s: %v; the node pods' Role and the node-scope policy must allow it (chart: node.failClosedCanary)", o.Namespace, pod.Name, err)}
	}
	defer func() {
		// A fresh context: the pod must go even when ctx ended.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := pods.Delete(dctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil && !apierrors.IsNotFound(err) {
			a.o.Log.Error(err, "delete the canary pod", "pod", pod.Name)
		}
	}()
	last, pullFailure := "not scheduled by the kubelet yet", ""
	for time.Now().Before(deadline) {
		if !lifecycle.Sleep(ctx, time.Second) {
			break
		}
		p, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			continue
		}
		if r, done := judgeCanary(p); done {
			return r
		} else if r.Message != "" {
			last = r.Message
			pullFailure = ""
			if r.Reason == names.ReasonCanaryImageNotPulled {
				pullFailure = r.Message
			}
		}
	}
	// A canary whose image the kubelet cannot pull never decides anything, at every run: the
	// node is not proven fail-closed, and says why, instead of staying Unknown for ever.
	if pullFailure != "" {
		return CanaryResult{Status: corev1.ConditionFalse, Reason: names.ReasonCanaryImageNotPulled, Message: pullFailureMessage(o, pullFailure)}
	}
	return CanaryResult{Status: corev1.ConditionUnknown, Reason: names.ReasonCanaryUndecided,
		Message: fmt.Sprintf("the canary's container was neither refused nor started within %s: %s", o.Timeout, last)}
}

// pullFailureMessage is the condition message of a canary whose image was not pulled. What to
// check comes first, and the kubelet's error gets the rest of the condition's room
// (kubeevents.MaxMessage) from its end: it repeats the image's name, and its cause (401
// Unauthorized, not found) is last. A long image reference or many Secrets: the head gives
// way, the cause stays.
func pullFailureMessage(o CanaryOptions, failure string) string {
	head := fmt.Sprintf("the canary's image %s was not pulled with %s within %s, so the node's fail-closed check cannot run: the chart's imagePullSecrets (the canary carries them) must name Secrets in %s with the registry's credentials; the kubelet: ",
		o.Image, pullSecretsPhrase(o.PullSecrets), o.Timeout, o.Namespace)
	const causeRoom = 120
	if len(head) > kubeevents.MaxMessage-causeRoom {
		head = kubeevents.CapTo(head, kubeevents.MaxMessage-causeRoom) + "; the kubelet: "
	}
	return head + kubeevents.KeepEnd(failure, kubeevents.MaxMessage-len(head))
}

// pullSecretsPhrase names the pull secrets the canary carried, so a condition caused by a
// wrong or missing Secret says which one to check.
func pullSecretsPhrase(secrets []string) string {
	if len(secrets) == 0 {
		return "no imagePullSecrets"
	}
	return "imagePullSecrets " + strings.Join(secrets, ", ")
}

// judgeCanary reads the canary pod's status: its container refused for the missing plugin
// proves the validator; a container that started proves the node fails open.
func judgeCanary(p *corev1.Pod) (CanaryResult, bool) {
	for _, st := range p.Status.ContainerStatuses {
		switch {
		case st.State.Waiting != nil && strings.Contains(st.State.Waiting.Message, CanaryPlugin):
			return CanaryResult{Status: corev1.ConditionTrue, Reason: "CanaryRefused",
				Message: "containerd's NRI validator refused a container requiring the absent plugin " + CanaryPlugin + ": pods that require nvdomain's NRI plugin cannot start without it"}, true
		case st.State.Running != nil || st.State.Terminated != nil:
			return CanaryResult{Status: corev1.ConditionFalse, Reason: "CanaryStarted",
				Message: "enable NRI's default validator in containerd (manifests/containerd/nri.toml, imported by the config's `imports` line) and restart containerd: a container requiring the absent NRI plugin " + CanaryPlugin + " started, so GPU containers would start without nvdomain placing them"}, true
		case st.State.Waiting != nil && pullReasons[st.State.Waiting.Reason]:
			return CanaryResult{Reason: names.ReasonCanaryImageNotPulled, Message: st.State.Waiting.Reason + ": " + st.State.Waiting.Message}, false
		case st.State.Waiting != nil && st.State.Waiting.Reason != "":
			return CanaryResult{Message: st.State.Waiting.Reason + ": " + st.State.Waiting.Message}, false
		}
	}
	// A pod that ended without a container status was rejected by the kubelet before any
	// container was created (OutOfpods, an eviction): it proves nothing either way.
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return CanaryResult{Status: corev1.ConditionUnknown, Reason: names.ReasonCanaryRejected,
			Message: fmt.Sprintf("the kubelet rejected the canary pod before creating its container (%s: %s); a canary runs again in 5 minutes", p.Status.Reason, p.Status.Message)}, true
	}
	return CanaryResult{}, false
}

// runtimeVerdict decides the canary without a pod when the NRI plugin reported a runtime
// that cannot validate adjustments (containerd before 2.2): such a node is not fail-closed
// whatever its configuration says (a required plugin that is absent, slow or crashed lets
// the container start), and the reason names the runtime and the fix. Nil while the plugin
// has not registered or the runtime validates: the canary then proves the configuration.
func (a *Agent) runtimeVerdict() *CanaryResult {
	if a.o.NRIStateFile == "" {
		return nil
	}
	// Read here, not from the agent's books: the canary runs in a goroutine of its own.
	doc, err := nristate.Read(a.o.NRIStateFile)
	if err != nil || doc.Runtime == nil || doc.Runtime.FailClosed {
		return nil
	}
	r := runtimeResult(doc.Runtime)
	return &r
}

// runtimeResult is the verdict on a node whose runtime cannot validate NRI adjustments.
func runtimeResult(r *nristate.Runtime) CanaryResult {
	return CanaryResult{Status: corev1.ConditionFalse, Reason: names.ReasonRuntimeWithoutValidator, Message: kubeevents.Cap(r.Why)}
}

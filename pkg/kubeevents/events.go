// Package kubeevents records Kubernetes Events and sets Node conditions for nvdomain's node-side components. They
// write Events on Pods and Nodes from background workers, so a plain create with a short
// timeout is enough; an Event that cannot be written is logged by the caller, never retried
// forever.
package kubeevents

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// Reasons of the Events the NRI plugin records on pods; `nvdomain explain` lists them.
const (
	// ReasonGPUsAssigned: a container got its GPUs; the message names them and the domain.
	ReasonGPUsAssigned = "GPUsAssigned"
	// ReasonTensorParallelNotPinned: a tensor-parallel container arrived without a domain.
	ReasonTensorParallelNotPinned = "TensorParallelNotPinned"
)

// MaxMessage caps the message of every Event and Node condition nvdomain writes. Messages
// put the status, the field and the fix first, so the cut loses only detail; the whole text is
// in the component's log and in `nvdomain explain`. The cap keeps `kubectl describe` readable
// and a message that names many pods or GPUs from growing without bound (the API's own limit
// is 1 KiB for events.k8s.io notes).
const MaxMessage = 512

// capSuffix ends a cut message and says where the rest is.
const capSuffix = " … (more: nvdomain explain, or the log)"

// Cap returns msg cut to MaxMessage bytes, on a rune boundary, with capSuffix.
func Cap(msg string) string {
	if len(msg) <= MaxMessage {
		return msg
	}
	cut := MaxMessage - len(capSuffix)
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut] + capSuffix
}

// KeepEnd returns the end of msg in at most n bytes, on a rune boundary, starting with "…"
// when cut: for a message whose cause comes last (the kubelet's pull errors).
func KeepEnd(msg string, n int) string {
	if len(msg) <= n {
		return msg
	}
	cut := len(msg) - n + len("…")
	for cut < len(msg) && !utf8.RuneStart(msg[cut]) {
		cut++
	}
	return "…" + msg[cut:]
}

// CapTo returns msg cut to at most n bytes, on a rune boundary, ending in "…" when cut: for
// the first part of a message whose end must survive Cap.
func CapTo(msg string, n int) string {
	if len(msg) <= n {
		return msg
	}
	cut := max(n-len("…"), 0)
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut] + "…"
}

// Event is what to record and about which object.
type Event struct {
	Object    corev1.ObjectReference
	Type      string // corev1.EventTypeNormal or EventTypeWarning
	Reason    string
	Message   string
	Component string
	Host      string
}

// NodeRef refers to a Node by name.
func NodeRef(name string) corev1.ObjectReference {
	return corev1.ObjectReference{Kind: "Node", Name: name, UID: types.UID(name), APIVersion: "v1"}
}

// PodRef refers to a Pod.
func PodRef(namespace, name, uid string) corev1.ObjectReference {
	return corev1.ObjectReference{Kind: "Pod", Namespace: namespace, Name: name, UID: types.UID(uid), APIVersion: "v1"}
}

// Record creates the Event. Node Events live in the default namespace, as the kubelet's do.
func Record(ctx context.Context, c kubernetes.Interface, e Event) error {
	ns := e.Object.Namespace
	if ns == "" {
		ns = metav1.NamespaceDefault
	}
	now := metav1.Now()
	ev := &corev1.Event{
		// Named like client-go's recorder names them (object name + hex timestamp) rather than
		// generated, so every client, fakes included, sees distinct Events.
		ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", e.Object.Name, now.UnixNano()), Namespace: ns},
		InvolvedObject: e.Object,
		Reason:         e.Reason,
		Message:        Cap(e.Message),
		Type:           e.Type,
		Source:         corev1.EventSource{Component: e.Component, Host: e.Host},
		FirstTimestamp: now,
		LastTimestamp:  now,
		Count:          1,
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := c.CoreV1().Events(ns).Create(cctx, ev, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("record %s event on %s %s: %w", e.Reason, e.Object.Kind, e.Object.Name, err)
	}
	return nil
}

// SetNodeCondition writes one condition of type cond.Type on a Node's status, keeping its
// lastTransitionTime when the status does not change. The patch is strategic (conditions
// merge by type), so the kubelet's conditions and other writers' stay as they are.
func SetNodeCondition(ctx context.Context, c kubernetes.Interface, node, fieldManager string, cond corev1.NodeCondition) error {
	now := metav1.Now()
	cond.LastHeartbeatTime, cond.LastTransitionTime = now, now
	cond.Message = Cap(cond.Message)
	obj, err := c.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get node %s: %w", node, err)
	}
	for _, have := range obj.Status.Conditions {
		if have.Type == cond.Type && have.Status == cond.Status {
			cond.LastTransitionTime = have.LastTransitionTime
		}
	}
	body, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{cond}}})
	if err != nil {
		return fmt.Errorf("node condition %s: %w", cond.Type, err)
	}
	if _, err := c.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, body, metav1.PatchOptions{FieldManager: fieldManager}, "status"); err != nil {
		return fmt.Errorf("set condition %s on node %s: %w", cond.Type, node, err)
	}
	return nil
}

// OwnerObject is the object an owner reference names, in namespace, as an Event's subject: an
// Event on the Deployment, Job or LeaderWorkerSet a user looks at, recorded without reading it.
func OwnerObject(namespace string, o metav1.OwnerReference) runtime.Object {
	return &metav1.PartialObjectMetadata{
		TypeMeta:   metav1.TypeMeta{APIVersion: o.APIVersion, Kind: o.Kind},
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: o.Name, UID: o.UID},
	}
}

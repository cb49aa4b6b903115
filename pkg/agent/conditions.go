package agent

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nvdomain/nvdomain/pkg/kubeevents"
	"github.com/nvdomain/nvdomain/pkg/names"
)

// SetCondition writes one condition of type cond.Type on the Node's status, keeping its
// lastTransitionTime when the status does not change. The patch is strategic (conditions
// merge by type), so the kubelet's conditions and other writers' stay as they are.
func (p *Publisher) SetCondition(ctx context.Context, cond corev1.NodeCondition) error {
	return kubeevents.SetNodeCondition(ctx, p.Client, p.Node, "nvdomain-agent", cond)
}

// condition sets a condition when it differs from the last one this agent wrote (the period
// re-asserts it, so a Node re-created meanwhile gets it back).
func (a *Agent) condition(ctx context.Context, typ corev1.NodeConditionType, status corev1.ConditionStatus, reason, msg string, force bool) {
	key := string(status) + "/" + reason + "/" + msg
	if a.conditions == nil {
		a.conditions = map[corev1.NodeConditionType]string{}
	}
	if !force && a.conditions[typ] == key {
		return
	}
	if err := a.publisher.SetCondition(ctx, corev1.NodeCondition{Type: typ, Status: status, Reason: reason, Message: msg}); err != nil {
		a.o.Log.Error(err, "set node condition", "type", typ)
		return
	}
	a.conditions[typ] = key
}

// Clear removes everything the agent owns on the Node: labels, annotations and domain
// resources (a publish of nothing), and its conditions.
func (p *Publisher) Clear(ctx context.Context) error {
	if _, err := p.Publish(ctx, Desired{}); err != nil {
		return err
	}
	var del []map[string]any
	for _, t := range []string{names.ConditionTopology, names.ConditionFailClosed} {
		del = append(del, map[string]any{"type": t, "$patch": "delete"})
	}
	body, _ := json.Marshal(map[string]any{"status": map[string]any{"conditions": del}})
	if _, err := p.Client.CoreV1().Nodes().Patch(ctx, p.Node, types.StrategicMergePatchType, body, metav1.PatchOptions{FieldManager: "nvdomain-agent"}, "status"); err != nil {
		return fmt.Errorf("remove nvdomain conditions from node %s: %w", p.Node, err)
	}
	return nil
}

// HasState reports whether a Node carries anything an agent publishes under these names:
// the uninstall hook waits until no Node does.
func HasState(n names.Names) func(*corev1.Node) bool {
	return func(node *corev1.Node) bool {
		for k := range node.Labels {
			if ownsLabel(n, k) {
				return true
			}
		}
		for k := range node.Annotations {
			if ownsAnnotation(n, k) {
				return true
			}
		}
		for r := range node.Status.Capacity {
			if _, ok := n.ParseDomainResource(string(r)); ok {
				return true
			}
		}
		for _, c := range node.Status.Conditions {
			if c.Type == names.ConditionTopology || c.Type == names.ConditionFailClosed {
				return true
			}
		}
		return false
	}
}

// Package lifecycle is nvdomain's uninstall protocol, which strands no pod and leaves no
// state. The order matters:
//
//  1. The chart's pre-delete hook (Uninstall) deletes the webhook configurations and the
//     admission policies first, so no pod creation waits on a webhook that is going away and
//     no new pod is made to require the NRI plugin.
//  2. It makes the kept node objects collectable (the ServiceAccount, Role, bindings and the
//     node-scope policy owned by the node ClusterRole) and marks the DaemonSets
//     with the uninstall annotation. The chart keeps them through `helm uninstall`
//     (helm.sh/resource-policy: keep), because every pod admitted earlier carries NRI's
//     required-plugins annotation for ever: with no plugin named nvdomain on its node, none of
//     its containers could start again, and a crashed vLLM container would never restart.
//  3. Each node pod sees the mark (WatchUninstall): the agent removes its node's labels,
//     annotations, domain capacity and conditions, and the files nvdomain put on the host; the
//     NRI plugin turns pass-through (it changes and refuses nothing, but its name satisfies
//     the annotation) and counts the pods on the node that still require it. The hook waits
//     until no node carries nvdomain state, and clears what is left itself at its timeout.
//  4. Helm deletes the rest of the release.
//  5. When no pod on its node requires the plugin, a node pod marks itself drained; when
//     every node pod is drained, it deletes the DaemonSets and the node ClusterRole, and the
//     garbage collector takes what they own (Drainer).
package lifecycle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/nvdomain/nvdomain/pkg/names"
)

// Release names the objects of one Helm release that the protocol touches; the chart's
// templates name them the same way.
type Release struct {
	Name, Namespace string
}

// NodeDaemonSets are the classic and the DRA node DaemonSets.
func (r Release) NodeDaemonSets() []string { return []string{r.Name + "-node", r.Name + "-node-dra"} }

// Node is the name of the node pods' ServiceAccount, ClusterRole(Binding) and Role(Binding).
func (r Release) Node() string { return r.Name + "-node" }

// NodePodSelector selects the pods of both node DaemonSets.
func (r Release) NodePodSelector() string {
	return "app.kubernetes.io/name=nvdomain,app.kubernetes.io/instance=" + r.Name + ",app.kubernetes.io/component in (node,node-dra)"
}

// PodPolicies are the ValidatingAdmissionPolicies (and their bindings, of the same names)
// that judge pods; NodeScopePolicy bounds the node pods' credentials.
func (r Release) PodPolicies() []string {
	return []string{r.Name + "-pod-annotations", r.Name + "-gpu-env"}
}

// NodeScopePolicy: see PodPolicies.
func (r Release) NodeScopePolicy() string { return r.Name + "-node-scope" }

// NodeCleaner removes nvdomain's state from one Node (the agent's Publisher with nothing to
// publish); Uninstall calls it for nodes the agents did not clean in time.
type NodeCleaner func(ctx context.Context, node string) error

// HasState reports whether a Node carries any nvdomain label, annotation, resource or
// condition.
type HasState func(node *corev1.Node) bool

// UninstallOptions configure the pre-delete hook.
type UninstallOptions struct {
	Client  kubernetes.Interface
	Names   names.Names
	Release Release
	// Timeout bounds the wait for the node pods to clean their nodes.
	Timeout  time.Duration
	Clean    NodeCleaner
	HasState HasState
	Out      io.Writer
}

// Uninstall runs steps 1 to 3 of the protocol and returns once no node carries nvdomain
// state. Only a failure to remove the admission objects is an error: that must stop the
// uninstall, or pods would be admitted by a webhook that is going away.
func Uninstall(ctx context.Context, o UninstallOptions) error {
	c, rel, out := o.Client, o.Release, o.Out
	// 1. Admission first.
	del := metav1.DeleteOptions{}
	if err := ignoreNotFound(c.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(ctx, rel.Name, del)); err != nil {
		return fmt.Errorf("delete MutatingWebhookConfiguration %s: %w", rel.Name, err)
	}
	if err := ignoreNotFound(c.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(ctx, rel.Name, del)); err != nil {
		return fmt.Errorf("delete ValidatingWebhookConfiguration %s: %w", rel.Name, err)
	}
	// The pod policies go; the node-scope policy stays (kept by the chart, owned by the
	// node ClusterRole below): it bounds the node pods' credentials for the whole drain.
	for _, name := range rel.PodPolicies() {
		if err := ignoreNotFound(c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(ctx, name, del)); err != nil {
			return fmt.Errorf("delete ValidatingAdmissionPolicyBinding %s: %w", name, err)
		}
		if err := ignoreNotFound(c.AdmissionregistrationV1().ValidatingAdmissionPolicies().Delete(ctx, name, del)); err != nil {
			return fmt.Errorf("delete ValidatingAdmissionPolicy %s: %w", name, err)
		}
	}
	fmt.Fprintf(out, "removed the webhook configurations and the pod policies %v: pods are no longer admitted by nvdomain\n", rel.PodPolicies())

	// 2. Make the kept objects collectable, then mark the DaemonSets.
	var marked []string
	for _, name := range rel.NodeDaemonSets() {
		if _, err := c.AppsV1().DaemonSets(rel.Namespace).Get(ctx, name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			continue
		} else if err != nil {
			return fmt.Errorf("get DaemonSet %s/%s: %w", rel.Namespace, name, err)
		}
		marked = append(marked, name)
	}
	if err := setOwners(ctx, c, rel); err != nil {
		return err
	}
	mark, _ := jsonPatch(map[string]any{"metadata": map[string]any{"annotations": map[string]string{o.Names.UninstallAnnotation(): time.Now().UTC().Format(time.RFC3339)}}})
	// The node Role and ClusterRole first, then the DaemonSets, whose mark starts the drain:
	// the node-scope policy lets a node pod delete each of them only while it carries the
	// mark, so one compromised node cannot tear nvdomain down on every node (review node-side
	// M3).
	if len(marked) > 0 {
		if _, err := c.RbacV1().Roles(rel.Namespace).Patch(ctx, rel.Node(), types.MergePatchType, mark, metav1.PatchOptions{}); ignoreNotFound(err) != nil {
			return fmt.Errorf("mark Role %s/%s for uninstall: %w", rel.Namespace, rel.Node(), err)
		}
		if _, err := c.RbacV1().ClusterRoles().Patch(ctx, rel.Node(), types.MergePatchType, mark, metav1.PatchOptions{}); ignoreNotFound(err) != nil {
			return fmt.Errorf("mark ClusterRole %s for uninstall: %w", rel.Node(), err)
		}
	}
	for _, name := range marked {
		if _, err := c.AppsV1().DaemonSets(rel.Namespace).Patch(ctx, name, types.MergePatchType, mark, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("mark DaemonSet %s/%s for uninstall: %w", rel.Namespace, name, err)
		}
	}
	if len(marked) > 0 {
		fmt.Fprintf(out, "marked %v: the node pods clean their nodes and serve the NRI plugin in pass-through until no pod requires it, then delete themselves\n", marked)
	}

	// 3. Wait for clean nodes; clean the rest.
	deadline := time.Now().Add(o.Timeout)
	for {
		dirty, err := dirtyNodes(ctx, c, o.HasState)
		if err != nil {
			return err
		}
		if len(dirty) == 0 {
			fmt.Fprintln(out, "no node carries nvdomain labels, annotations, domain resources or conditions")
			return nil
		}
		if len(marked) == 0 || time.Now().After(deadline) {
			var errs []error
			for _, n := range dirty {
				if err := o.Clean(ctx, n); err != nil {
					errs = append(errs, err)
				}
			}
			fmt.Fprintf(out, "cleaned %d node(s) the node pods had not: %v\n", len(dirty), dirty)
			if err := errors.Join(errs...); err != nil {
				fmt.Fprintf(out, "WARNING some nodes keep nvdomain state: %v; `kubectl nvdomain status` lists them\n", err)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func dirtyNodes(ctx context.Context, c kubernetes.Interface, has HasState) ([]string, error) {
	nodes, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	var dirty []string
	for i := range nodes.Items {
		if has(&nodes.Items[i]) {
			dirty = append(dirty, nodes.Items[i].Name)
		}
	}
	return dirty, nil
}

// setOwners hands the node pods' ServiceAccount, Role and RoleBinding, their
// ClusterRoleBinding and the node-scope policy to the node ClusterRole (a cluster-scoped
// owner may own namespaced objects), so that deleting it, the drain's last step, takes them
// all; the ServiceAccount, and with it the node pods' credentials, goes last.
func setOwners(ctx context.Context, c kubernetes.Interface, rel Release) error {
	name := rel.Node()
	cr, err := c.RbacV1().ClusterRoles().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("get ClusterRole %s: %w", name, err)
	}
	body, _ := jsonPatch(map[string]any{"metadata": map[string]any{"ownerReferences": []metav1.OwnerReference{{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole", Name: cr.Name, UID: cr.UID}}}})
	vap := rel.NodeScopePolicy()
	for _, o := range []struct {
		what  string
		patch func() error
	}{
		{"ServiceAccount " + rel.Namespace + "/" + name, func() error {
			_, err := c.CoreV1().ServiceAccounts(rel.Namespace).Patch(ctx, name, types.MergePatchType, body, metav1.PatchOptions{})
			return err
		}},
		{"Role " + rel.Namespace + "/" + name, func() error {
			_, err := c.RbacV1().Roles(rel.Namespace).Patch(ctx, name, types.MergePatchType, body, metav1.PatchOptions{})
			return err
		}},
		{"RoleBinding " + rel.Namespace + "/" + name, func() error {
			_, err := c.RbacV1().RoleBindings(rel.Namespace).Patch(ctx, name, types.MergePatchType, body, metav1.PatchOptions{})
			return err
		}},
		{"ClusterRoleBinding " + name, func() error {
			_, err := c.RbacV1().ClusterRoleBindings().Patch(ctx, name, types.MergePatchType, body, metav1.PatchOptions{})
			return err
		}},
		{"ValidatingAdmissionPolicy " + vap, func() error {
			_, err := c.AdmissionregistrationV1().ValidatingAdmissionPolicies().Patch(ctx, vap, types.MergePatchType, body, metav1.PatchOptions{})
			return err
		}},
		{"ValidatingAdmissionPolicyBinding " + vap, func() error {
			_, err := c.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Patch(ctx, vap, types.MergePatchType, body, metav1.PatchOptions{})
			return err
		}},
	} {
		if err := ignoreNotFound(o.patch()); err != nil {
			return fmt.Errorf("hand %s to the node ClusterRole: %w", o.what, err)
		}
	}
	return nil
}

// WatchUninstall returns a channel that is closed once DaemonSet namespace/name carries the
// uninstall annotation. It watches that one object (a field selector on its name), so a
// thousand node pods cost the apiserver a thousand idle watches, not polls. An empty name
// gives a channel that never closes.
func WatchUninstall(ctx context.Context, c kubernetes.Interface, n names.Names, namespace, name string, log logr.Logger) <-chan struct{} {
	ch := make(chan struct{})
	if name == "" || c == nil {
		return ch
	}
	key := n.UninstallAnnotation()
	go func() {
		for ctx.Err() == nil {
			ds, err := c.AppsV1().DaemonSets(namespace).Get(ctx, name, metav1.GetOptions{})
			if err == nil && ds.Annotations[key] != "" {
				close(ch)
				return
			}
			if err != nil {
				if ctx.Err() == nil {
					log.V(1).Info("read own DaemonSet for the uninstall mark; retrying", "daemonset", namespace+"/"+name, "error", err.Error())
				}
				Sleep(ctx, 10*time.Second)
				continue
			}
			w, err := c.AppsV1().DaemonSets(namespace).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name, ResourceVersion: ds.ResourceVersion})
			if err != nil {
				Sleep(ctx, 10*time.Second)
				continue
			}
			for ev := range w.ResultChan() {
				if d, ok := ev.Object.(*appsv1.DaemonSet); ok && d.Annotations[key] != "" {
					w.Stop()
					close(ch)
					return
				}
			}
			w.Stop()
			Sleep(ctx, time.Second)
		}
	}()
	return ch
}

// Drainer is step 5, run by each node pod once its node is clean.
type Drainer struct {
	Client  kubernetes.Interface
	Names   names.Names
	Release Release
	// Pod is this node pod's name, DaemonSet its DaemonSet's.
	Pod, DaemonSet string
	// Drained reports whether no pod on this node requires the NRI plugin any more;
	// OnDrained, when set, runs once when it first does (the host files go then).
	Drained   func() bool
	OnDrained func()
	Period    time.Duration
	Log       logr.Logger
}

// ErrReinstalled ends a node pod's drain: its DaemonSet is no longer marked, because the
// release was installed again over the kept objects (the chart's template clears the mark).
// The pod's containers then exit, and start again as the new release's.
var ErrReinstalled = errors.New("the release was installed again over the kept node DaemonSet; restarting as the new release's node pod")

// Run marks the pod drained once Drained holds, and when every node pod is marked, deletes
// the node DaemonSets and ClusterRole. It returns nil when it did, or when ctx ends, and
// ErrReinstalled when the mark went away meanwhile.
func (d Drainer) Run(ctx context.Context) error {
	period := d.Period
	if period <= 0 {
		period = 5 * time.Second
	}
	key := d.Names.UninstallDrainedAnnotation()
	marked := false
	for {
		if d.DaemonSet != "" {
			if ok, err := Marked(ctx, d.Client, d.Names, d.Release.Namespace, d.DaemonSet); err == nil && !ok {
				return ErrReinstalled
			}
		}
		if !marked && d.Drained() {
			body, _ := jsonPatch(map[string]any{"metadata": map[string]any{"annotations": map[string]string{key: "true"}}})
			if _, err := d.Client.CoreV1().Pods(d.Release.Namespace).Patch(ctx, d.Pod, types.MergePatchType, body, metav1.PatchOptions{}); err != nil {
				d.Log.Error(err, "mark this node pod drained")
			} else {
				marked = true
				d.Log.Info("no pod on this node requires the NRI plugin any more")
				if d.OnDrained != nil {
					d.OnDrained()
				}
			}
		}
		if marked && d.lastOne(ctx) {
			return nil
		}
		if !Sleep(ctx, period) {
			return nil
		}
	}
}

// Marked reports whether DaemonSet namespace/name carries the uninstall mark; a DaemonSet
// that is gone is not marked.
func Marked(ctx context.Context, c kubernetes.Interface, n names.Names, namespace, name string) (bool, error) {
	ds, err := c.AppsV1().DaemonSets(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return ds.Annotations[n.UninstallAnnotation()] != "", nil
}

// WaitUnmarked blocks until DaemonSet namespace/name exists without the uninstall mark (the
// release was installed again), checking every period; it reports whether it saw that before
// ctx ended. A DaemonSet that is gone is being deleted with this pod: that is not a reinstall.
func WaitUnmarked(ctx context.Context, c kubernetes.Interface, n names.Names, namespace, name string, period time.Duration) bool {
	for Sleep(ctx, period) {
		ds, err := c.AppsV1().DaemonSets(namespace).Get(ctx, name, metav1.GetOptions{})
		if err == nil && ds.DeletionTimestamp == nil && ds.Annotations[n.UninstallAnnotation()] == "" {
			return true
		}
	}
	return false
}

// mayServe reports whether a node pod serves, or is about to serve, an NRI plugin: it runs,
// or it is Pending on a Ready node (after a reboot, in its init containers). One on a node
// that is down, or that cannot start there, holds nothing up.
func (d Drainer) mayServe(ctx context.Context, p *corev1.Pod) bool {
	switch p.Status.Phase {
	case corev1.PodRunning:
		return true
	case corev1.PodPending:
		if p.Spec.NodeName == "" {
			return false
		}
		node, err := d.Client.CoreV1().Nodes().Get(ctx, p.Spec.NodeName, metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue
			}
		}
	}
	return false
}

// lastOne deletes the DaemonSets and the ClusterRole when every node pod is drained.
func (d Drainer) lastOne(ctx context.Context) bool {
	pods, err := d.Client.CoreV1().Pods(d.Release.Namespace).List(ctx, metav1.ListOptions{LabelSelector: d.Release.NodePodSelector()})
	if err != nil {
		d.Log.Error(err, "list the node pods")
		return false
	}
	waiting := 0
	for _, p := range pods.Items {
		// A node pod that does not run (its node down, its image not pulled) serves no plugin
		// and never reports: it holds nothing up.
		if p.DeletionTimestamp == nil && d.mayServe(ctx, &p) && p.Annotations[d.Names.UninstallDrainedAnnotation()] != "true" {
			waiting++
		}
	}
	if waiting > 0 {
		return false
	}
	// The DaemonSets first (their pods stop serving; the node-scope policy still bounds what
	// their credentials may do), then the Role that lets node pods create and delete pods,
	// then the ClusterRole, which takes the ServiceAccount, the bindings and the node-scope
	// policy with it (setOwners). Deleting the DaemonSets deletes this very pod, whose
	// SIGTERM ends ctx: the rest runs on a context of its own, since a ClusterRole left behind
	// could never be deleted by a later try (listing pods needs the Role, which is gone).
	for _, name := range d.Release.NodeDaemonSets() {
		ds, err := d.Client.AppsV1().DaemonSets(d.Release.Namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			d.Log.Error(err, "read the node DaemonSet", "daemonset", name)
			return false
		}
		if ds.Annotations[d.Names.UninstallAnnotation()] == "" {
			// Installed again: the new release owns it now.
			return false
		}
		// Only the marked version: an install that clears the mark meanwhile wins.
		opts := metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &ds.UID, ResourceVersion: &ds.ResourceVersion}}
		if err := ignoreNotFound(d.Client.AppsV1().DaemonSets(d.Release.Namespace).Delete(ctx, name, opts)); err != nil {
			d.Log.Error(err, "delete the node DaemonSet", "daemonset", name)
			return false
		}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	// A release installed again meanwhile recreated a DaemonSet: its Role and ClusterRole stay.
	// Asked while the Role still grants reading DaemonSets.
	for _, name := range d.Release.NodeDaemonSets() {
		if ds, err := d.Client.AppsV1().DaemonSets(d.Release.Namespace).Get(ctx, name, metav1.GetOptions{}); err == nil && ds.DeletionTimestamp == nil {
			return false
		}
	}
	// The Role, not its RoleBinding: the right to delete the Role comes through that binding,
	// and a binding to a Role that is gone grants nothing. The ClusterRole's garbage collection
	// takes the RoleBinding (setOwners).
	if err := ignoreNotFound(d.Client.RbacV1().Roles(d.Release.Namespace).Delete(ctx, d.Release.Node(), metav1.DeleteOptions{})); err != nil {
		d.Log.Error(err, "delete the node Role")
		return false
	}
	for {
		err := ignoreNotFound(d.Client.RbacV1().ClusterRoles().Delete(ctx, d.Release.Node(), metav1.DeleteOptions{}))
		if err == nil {
			break
		}
		d.Log.Error(err, "delete the node ClusterRole; trying again", "clusterrole", d.Release.Node())
		if !Sleep(ctx, time.Second) {
			return false
		}
	}
	d.Log.Info("every node is drained: deleted the node DaemonSets and their RBAC; nvdomain is gone")
	return true
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// Sleep waits for d or ctx; it reports whether d passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func jsonPatch(v any) ([]byte, error) { return json.Marshal(v) }

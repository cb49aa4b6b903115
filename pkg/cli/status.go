package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/nvdomain/nvdomain/pkg/dra"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/placement"
	"github.com/nvdomain/nvdomain/pkg/queueing"
	"github.com/nvdomain/nvdomain/pkg/rules"
	"github.com/nvdomain/nvdomain/pkg/topology"
	"github.com/nvdomain/nvdomain/pkg/topology/simulated"
)

// StatusAPIVersion and StatusKind identify the document `nvdomain status -o json` prints.
// Within one apiVersion fields are only ever added, never renamed or removed, so scripts may
// rely on the ones they read.
const (
	StatusAPIVersion = "nvdomain.io/v1"
	StatusKind       = "DomainStatusList"
)

// StatusList is the -o json document: one item per node and domain, sorted by node name and
// domain id.
type StatusList struct {
	APIVersion string         `json:"apiVersion"`
	Kind       string         `json:"kind"`
	Items      []DomainStatus `json:"items"`
	// Gated are the pinned pods held back by scheduling gates (Kueue's plain pods, say),
	// namespace/name, cluster-wide (-n narrows them; --node and -l do not, since they are on
	// no node yet): the scheduler does not try them, their pin was chosen at creation and
	// cannot follow the room, and a bare one cannot be moved once ungated.
	Gated []string `json:"gated,omitempty"`
	// Warnings are what keeps GPUs from pods beyond the table, each with its fix: an
	// unhealthy GPU (the DRA driver taints its devices, so no new claim lands there), a DRA
	// node whose driver withdrew its devices (a device plugin advertises nvidia.com/gpu
	// there), another DeviceClass that maps nvdomain's extendedResourceName.
	Warnings []string `json:"warnings,omitempty"`
	// Pools are the declared GPU pools that scale from zero (docs/pools.md), with the pods
	// waiting for each to add a node: pinned pods no node they may run on can hold now.
	Pools []PoolStatus `json:"pools,omitempty"`
	// Cliques are the multi-node NVLink cliques (GB200/GB300 NVL72; docs/multinode.md): the
	// nodes one nvidia.com/gpu.clique value labels, their GPUs and free GPUs, and the
	// LeaderWorkerSet groups pinned to each.
	Cliques []CliqueStatus `json:"cliques,omitempty"`
}

// CliqueStatus is one clique.
type CliqueStatus struct {
	ID    string `json:"id"`
	Nodes int    `json:"nodes"`
	GPUs  int    `json:"gpus"`
	Free  int    `json:"free"`
	// Waiting is the GPUs groups pinned to the clique still wait for.
	Waiting int `json:"waiting"`
	// Unavailable counts its nodes that are no room now (cordoned, NotReady, NRI plugin lost).
	Unavailable int `json:"unavailable,omitempty"`
	// Groups are namespace/<LeaderWorkerSet>/<group index>, sorted.
	Groups []string `json:"groups"`
}

// PoolStatus is one declared pool.
type PoolStatus struct {
	Name string `json:"name"`
	// NodeSelector is the labels its nodes carry, k=v,k=v.
	NodeSelector string `json:"nodeSelector"`
	// Domains are the domain sizes a node of the pool has, by id.
	Domains []int `json:"domains"`
	// Waiting are the pods waiting for the pool to scale up, namespace/name.
	Waiting []string `json:"waiting"`
}

// DomainStatus is one domain of one node.
type DomainStatus struct {
	Node   string `json:"node"`
	Domain int    `json:"domain"`
	// Size is the domain's GPUs as the agent publishes them (its size label).
	Size int `json:"size"`
	// Used is Size minus Free: GPUs held by bound pods pinned to the domain, and GPUs that
	// unpinned containers hold (the agent lowers the domain's allocatable by those).
	Used int `json:"used"`
	// Free is what the scheduler can still promise pods pinned to this domain id here.
	Free int `json:"free"`
	// GPUs are the domain's GPU indexes (the node's GPU-list annotation).
	GPUs []int `json:"gpus"`
	// Pods are the bound pods pinned to the domain on this node, namespace/name.
	Pods []string `json:"pods"`
	// Waiting are the pods pinned to this domain id, not bound, that may run on this node and
	// fit in the domain's size.
	Waiting []string `json:"waiting"`
	// Stranded are the waiting pods the re-pin plan calls stranded: no node they may run on
	// has room in their domain id while another id has.
	Stranded []string `json:"stranded"`
	// Stale is true while the agent publishes its last good topology because its source is
	// broken; Mismatch while the node's NRI plugin serves another topology than the agent
	// publishes.
	Stale    bool `json:"stale"`
	Mismatch bool `json:"mismatch"`
	// UsageUnknown marks a DRA node's domain whose use could not be read (the ResourceClaims
	// could not be listed): Used and Free then mean nothing.
	UsageUnknown bool `json:"usageUnknown,omitempty"`
	// FailClosed is the node's NvdomainFailClosed condition: "yes" once its fail-closed
	// canary was refused, "no" when it started (containerd does not enforce NRI's required
	// plugins there), "unknown" before a verdict or without the canary.
	FailClosed string `json:"failClosed"`
}

// Output formats of status.
const (
	outputTable = ""
	outputWide  = "wide"
	outputJSON  = "json"
)

// StatusOptions is `nvdomain status`: kubectl's Complete → Validate → Run.
type StatusOptions struct {
	Factory  ClusterFactory
	Output   string
	Node     string
	Selector string
	// Pools is the ConfigMap (namespace/name) declaring the GPU pools; empty: none.
	Pools string

	IOStreams
	namesFromFlags func() (names.Names, error)

	// Filled by Complete (names, selector) and Run (client, namespace).
	client    kubernetes.Interface
	names     names.Names
	namespace string // only pods of this namespace are listed, when the user named one
	selector  labels.Selector
	// draHeld is, per DRA node, the GPUs the driver's allocated ResourceClaims hold there and
	// the pods each claim is reserved for (Run; nil where claims cannot be listed).
	draHeld map[string]map[int][]string
}

func newStatus(f ClusterFactory, streams IOStreams) *cobra.Command {
	o := &StatusOptions{Factory: f, IOStreams: streams}
	cmd := &cobra.Command{
		Use:   "status [--node NAME] [-l SELECTOR] [-o wide|json]",
		Short: "Show every node's NVSwitch domains: size, GPUs used and free, pinned pods, waiting and stranded pods",
		Long: `Lists one row per node and NVSwitch domain:

  SIZE       the domain's GPUs, as the agent publishes them
  GPUS USED  GPUs held there: bound pods pinned to the domain, and unpinned containers;
             on a DRA node, the GPUs of the domain that allocated ResourceClaims hold
  FREE       GPUs the scheduler can still give to pods pinned to this domain id
  PODS       bound pods pinned to the domain on this node
  WAITING    pods pinned to this domain id, not bound yet, that may run on this node
  STRANDED   waiting pods whose domain id has no room on any node they may run on while
             another id has: the re-pin controller moves them (see nvdomain explain)
  STALE      stale: the agent's topology source is broken and it publishes its last good
             topology; mismatch: the node's NRI plugin serves another topology
  FAIL-CLOSED yes: the node's fail-closed canary was refused (containerd enforces the NRI
             plugin); no: it started, and the node gets no TP pods (docs/node-side.md);
             no: old runtime: containerd before 2.2, which cannot refuse a container
             whose plugin is down, slow or crashed; unknown: no verdict yet

Under the table, a WARNING line for each unhealthy GPU, each DRA node whose driver withdrew
its devices, and each other DeviceClass that maps nvdomain's extendedResourceName (the
scheduler then uses only the newer class: pods asking for nvidia.com/gpu get no GPUs on the
other driver's nodes), each GPU node whose nvdomain node pod cannot run (its image cannot be
pulled, lacks the node's platform, or cannot execute there) and each GPU node the node
DaemonSets leave out by architecture (node.architectures); -o json lists them under
"warnings".

Usage is counted the way nvdomain's webhook counts it, from the domain resources of bound,
non-terminal pods that are not being deleted. Pods of every namespace are counted; -n shows
only that namespace's pods in PODS, WAITING and STRANDED (the GPU counts stay the node's).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.Complete(); err != nil {
				return err
			}
			if err := o.Validate(); err != nil {
				return err
			}
			return o.Run(cmd.Context())
		},
	}
	fs := cmd.Flags()
	fs.StringVarP(&o.Output, "output", "o", outputTable, "output format: wide (adds the domain's GPUs and the pod names) or json")
	fs.StringVar(&o.Node, "node", "", "show only this node")
	fs.StringVarP(&o.Selector, "selector", "l", "", "show only nodes matching this label selector, e.g. nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3")
	fs.StringVar(&o.Pools, "pools-configmap", DefaultPoolsConfigMap, "namespace/name of the ConfigMap declaring the GPU pools that scale from zero (the chart's <release>-pools in its namespace); empty: none")
	f.AddFlags(fs)
	o.namesFromFlags = addNamesFlags(cmd)
	return cmd
}

// addNamesFlags registers --label-prefix and --resource-prefix, as the webhook and the agent
// spell them, for clusters installed with other prefixes.
func addNamesFlags(cmd *cobra.Command) func() (names.Names, error) {
	gfs := flag.NewFlagSet(cmd.Name(), flag.ContinueOnError)
	build := names.BindFlags(gfs)
	cmd.Flags().AddGoFlagSet(gfs)
	return build
}

// Complete reads the flags. Connecting waits for Run, so that a wrong flag is reported before
// a missing kubeconfig.
func (o *StatusOptions) Complete() error {
	var err error
	if o.names, err = o.namesFromFlags(); err != nil {
		return fmt.Errorf("--label-prefix/--resource-prefix: %w", err)
	}
	if o.Selector != "" {
		if o.selector, err = labels.Parse(o.Selector); err != nil {
			return fmt.Errorf("--selector %q: %w; use the kubectl syntax, e.g. key=value,other!=x", o.Selector, err)
		}
	}
	return nil
}

// Validate checks the flags.
func (o *StatusOptions) Validate() error {
	switch o.Output {
	case outputTable, outputWide, outputJSON:
		return nil
	}
	return fmt.Errorf("--output %q: use wide or json, or leave it out for the table", o.Output)
}

// Run connects, lists the cluster and prints the domains.
func (o *StatusOptions) Run(ctx context.Context) error {
	ns, explicit, err := o.Factory.Namespace()
	if err != nil {
		return err
	}
	if explicit {
		o.namespace = ns
	}
	if o.client, err = o.Factory.Client(); err != nil {
		return err
	}
	if o.Node != "" {
		if _, err := o.client.CoreV1().Nodes().Get(ctx, o.Node, metav1.GetOptions{}); err != nil {
			if apierrors.IsNotFound(err) {
				return fmt.Errorf("--node %s: no such node; list them with kubectl get nodes", o.Node)
			}
			return fmt.Errorf("get node %s: %w", o.Node, err)
		}
	}
	s, err := loadSnapshot(ctx, o.client, o.names, o.Pools)
	if err != nil {
		return err
	}
	var claimsWarning string
	if o.draHeld, claimsWarning, err = draClaimsHeld(ctx, o.client); err != nil {
		return err
	}
	list := o.statusList(s)
	if claimsWarning != "" && slices.ContainsFunc(list.Items, func(it DomainStatus) bool { return it.UsageUnknown }) {
		list.Warnings = append(list.Warnings, claimsWarning)
	}
	classes, err := deviceClassWarnings(ctx, o.client)
	if err != nil {
		return err
	}
	list.Warnings = append(list.Warnings, classes...)
	list.Warnings = append(list.Warnings, heldDeviceWarnings(ctx, o.client, o.Node, o.selectsNode(s))...)
	list.Warnings = append(list.Warnings, kueueWarnings(ctx, o.client, o.names)...)
	list.Warnings = append(list.Warnings, nodePodWarnings(ctx, o.client, o.names, s.nodes, o.selectsNode(s))...)
	if len(list.Items) == 0 && o.Output != outputJSON {
		if _, err := fmt.Fprintln(o.ErrOut, o.emptyMessage()); err != nil {
			return err
		}
		if err := writePools(o.Out, list.Pools); err != nil {
			return err
		}
		if err := writeCliques(o.Out, list.Cliques); err != nil {
			return err
		}
		return writeWarnings(o.Out, list.Warnings)
	}
	switch o.Output {
	case outputJSON:
		enc := json.NewEncoder(o.Out)
		enc.SetIndent("", "  ")
		return enc.Encode(list)
	case outputWide:
		err = writeStatusTable(o.Out, list, true)
	default:
		err = writeStatusTable(o.Out, list, false)
	}
	if err == nil && len(list.Gated) > 0 {
		_, err = fmt.Fprintf(o.Out, "\n%d pinned pod(s) held by scheduling gates, not counted above: %s. Their domain was chosen at creation and is not chosen again when the gates go; a bare one that finds it full waits (run such work as a Job or Deployment, or in DRA mode). `kubectl nvdomain explain POD` says more.\n",
			len(list.Gated), strings.Join(list.Gated, ", "))
	}
	if err == nil {
		err = writePools(o.Out, list.Pools)
	}
	if err == nil {
		err = writeCliques(o.Out, list.Cliques)
	}
	if err == nil {
		err = writeWarnings(o.Out, list.Warnings)
	}
	return err
}

func writeWarnings(w io.Writer, warnings []string) error {
	for _, msg := range warnings {
		if _, err := fmt.Fprintf(w, "\nWARNING: %s\n", msg); err != nil {
			return err
		}
	}
	return nil
}

// deviceClassWarnings lists the DeviceClasses and names any that maps nvdomain's
// extendedResourceName too (dra.ExtendedResourceConflicts). A cluster that serves no
// resource.k8s.io/v1 has none; one that refuses the list gets a warning saying what is missing.
func deviceClassWarnings(ctx context.Context, c kubernetes.Interface) ([]string, error) {
	list, err := c.ResourceV1().DeviceClasses().List(ctx, metav1.ListOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case apierrors.IsForbidden(err):
		return []string{"cannot list DeviceClasses (resource.k8s.io), so a second class mapping nvidia.com/gpu would go unseen: grant list on deviceclasses to check for one"}, nil
	case err != nil:
		return nil, fmt.Errorf("list DeviceClasses: %w", err)
	}
	var ours *resourceapi.DeviceClass
	for i := range list.Items {
		if list.Items[i].Name == names.DRADeviceClass {
			ours = &list.Items[i]
		}
	}
	if ours == nil || ours.Spec.ExtendedResourceName == nil {
		return nil, nil
	}
	return dra.ExtendedResourceConflicts(list.Items, *ours.Spec.ExtendedResourceName), nil
}

// kueueWarnings says what in a Kueue installation keeps the TP pods it manages from running
// (queueing.Installation): a Kueue too old for nvdomain's watch, a Configuration that does not
// exclude the per-domain resources, Workloads held back for one. Nothing when Kueue is not
// installed; what cannot be read (no access, an unreachable API) is never an error, since
// status is about domains first: an unreadable Configuration is said to be unknown, unreadable
// Workloads and ClusterQueues are left out.
func kueueWarnings(ctx context.Context, c kubernetes.Interface, n names.Names) []string {
	groups, err := c.Discovery().ServerGroups()
	if err != nil {
		return nil
	}
	var in queueing.Installation
	for _, g := range groups.Groups {
		if g.Name == names.KueueGroup {
			for _, v := range g.Versions {
				in.Versions = append(in.Versions, v.Version)
			}
		}
	}
	if len(in.Versions) == 0 {
		return nil
	}
	in.ConfigFrom = "ConfigMap " + queueing.KueueConfigNamespace + "/" + queueing.KueueConfigMap
	cm, err := c.CoreV1().ConfigMaps(queueing.KueueConfigNamespace).Get(ctx, queueing.KueueConfigMap, metav1.GetOptions{})
	switch {
	case err != nil:
		in.ConfigErr = fmt.Errorf("%s: %w", in.ConfigFrom, err)
	case cm.Data[queueing.KueueConfigKey] == "":
		in.ConfigErr = fmt.Errorf("%s has no %s", in.ConfigFrom, queueing.KueueConfigKey)
	default:
		in.Config = []byte(cm.Data[queueing.KueueConfigKey])
	}
	// Workloads and ClusterQueues are read raw (no Kueue types here), a page at a time; a
	// fake clientset has no REST client.
	if rc := c.Discovery().RESTClient(); rc != nil && !reflect.ValueOf(rc).IsNil() && slices.Contains(in.Versions, names.KueueWorkloadVersion) {
		list := func(resource string, each func(*unstructured.Unstructured)) {
			cont := ""
			for {
				req := rc.Get().AbsPath("/apis", names.KueueGroup, names.KueueWorkloadVersion, resource).Param("limit", "500")
				if cont != "" {
					req = req.Param("continue", cont)
				}
				raw, err := req.Do(ctx).Raw()
				var page unstructured.UnstructuredList
				if err != nil || page.UnmarshalJSON(raw) != nil {
					return
				}
				for i := range page.Items {
					each(&page.Items[i])
				}
				if cont = page.GetContinue(); cont == "" {
					return
				}
			}
		}
		list("workloads", func(wl *unstructured.Unstructured) {
			if _, ok := queueing.RefusedDomainResource(wl, n); ok {
				in.Refused = append(in.Refused, wl.GetNamespace()+"/"+wl.GetName())
			}
		})
		list("clusterqueues", func(cq *unstructured.Unstructured) {
			if queueing.CoversDomainResource(cq.Object, n) {
				in.Covering = append(in.Covering, cq.GetName())
			}
		})
	}
	return in.Warnings(n)
}

// shows reports whether status shows a node: the one --node names, those --selector selects.
func (o *StatusOptions) shows(node *corev1.Node) bool {
	return (o.Node == "" || node.Name == o.Node) && (o.selector == nil || o.selector.Matches(labels.Set(node.Labels)))
}

// selectsNode is shows for the named node of the snapshot (false for one it does not have).
func (o *StatusOptions) selectsNode(s *snapshot) func(string) bool {
	return func(name string) bool {
		i := slices.IndexFunc(s.nodes, func(n corev1.Node) bool { return n.Name == name })
		return i >= 0 && o.shows(&s.nodes[i])
	}
}

// heldDeviceWarnings name, per node (only node, when set, and only those keep accepts), the
// DRA devices the driver taints names.DRATaintHeld: a claim holds a device it no longer
// publishes, and those GPUs take no new claim until it is unprepared. The slices are read in
// pages; a cluster without the DRA API has none; a read that fails is a warning of its own,
// not a failed status.
func heldDeviceWarnings(ctx context.Context, c kubernetes.Interface, node string, keep func(string) bool) []string {
	sel := "spec.driver=" + names.DRADriver
	if node != "" {
		sel += ",spec.nodeName=" + node
	}
	byNode := map[string][]string{}
	opts := metav1.ListOptions{FieldSelector: sel, Limit: 500}
	for {
		list, err := c.ResourceV1().ResourceSlices().List(ctx, opts)
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case apierrors.IsForbidden(err):
			return []string{"cannot list ResourceSlices (resource.k8s.io), so DRA devices tainted " + names.DRATaintHeld + " go unseen: grant list on resourceslices to see them"}
		case err != nil:
			return []string{fmt.Sprintf("cannot list ResourceSlices, so DRA devices tainted %s go unseen: %v", names.DRATaintHeld, err)}
		}
		for _, sl := range list.Items {
			n := ptr.Deref(sl.Spec.NodeName, "")
			if sl.Spec.Driver != names.DRADriver || (node != "" && n != node) || !keep(n) {
				continue
			}
			for _, d := range sl.Spec.Devices {
				if slices.ContainsFunc(d.Taints, func(t resourceapi.DeviceTaint) bool { return t.Key == names.DRATaintHeld }) && !slices.Contains(byNode[n], d.Name) {
					byNode[n] = append(byNode[n], d.Name)
				}
			}
		}
		if opts.Continue = list.Continue; opts.Continue == "" {
			break
		}
	}
	var out []string
	for _, n := range slices.Sorted(maps.Keys(byNode)) {
		devs := byNode[n]
		slices.Sort(devs)
		out = append(out, fmt.Sprintf("node %s: DRA devices %s carry the NoSchedule taint %s: a prepared claim holds a device the driver no longer publishes (dra.blocks switched off, the apiserver dropped the counters, or the topology changed), or a pod still runs on GPUs whose claim is gone (the node's GPUsHeldWithoutClaim Event names it), so those GPUs take no new claim until the claim is unprepared or the pod ends (delete it to free them)",
			n, strings.Join(devs, ", "), names.DRATaintHeld))
	}
	return out
}

// unproven reports whether an Unknown NvdomainFailClosed condition's reason says a canary ran
// and proved nothing; the others (not run yet, interrupted) pass by themselves.
func unproven(reason string) bool {
	switch reason {
	case names.ReasonCanaryNotCreated, names.ReasonCanaryRejected, names.ReasonCanaryUndecided:
		return true
	}
	return false
}

// nodeWarnings are a node's unhealthy GPUs (from the agent's topology annotation), a
// withdrawal of its DRA devices (the driver's NvdomainDRADevices condition), and a node not
// proven fail-closed (its NvdomainFailClosed condition False, or Unknown after a canary ran).
func nodeWarnings(n names.Names, node *corev1.Node) []string {
	var out []string
	if doc, ok := node.Annotations[n.TopologyAnnotation()]; ok {
		var top topology.Topology
		if err := top.UnmarshalJSON([]byte(doc)); err == nil {
			for _, g := range top.GPUs {
				if g.Unhealthy != "" {
					out = append(out, fmt.Sprintf("node %s: GPU %d is unhealthy (%s): on a DRA node its devices carry the NoSchedule taint %s (or are left out, where the apiserver drops device taints), so no new claim gets it; classic mode does not keep pods off it; replace or reset the GPU, and its source (NVML, or the simulated topology's health field) clears it",
						node.Name, g.Index, g.Unhealthy, names.DRATaintUnhealthy))
				}
			}
		}
	}
	for _, c := range node.Status.Conditions {
		if c.Type == names.ConditionDRADevices && c.Status == corev1.ConditionFalse {
			out = append(out, fmt.Sprintf("node %s: the DRA driver publishes none of its GPUs (%s: %s)", node.Name, c.Reason, c.Message))
		}
		// Not proven fail-closed: a canary that started or could not run (False), and one that
		// ran and decided nothing (Unknown with a reason; without one it has not run yet).
		if c.Type == names.ConditionFailClosed && (c.Status == corev1.ConditionFalse || (c.Status == corev1.ConditionUnknown && unproven(c.Reason))) {
			detail := string(c.Status)
			if c.Reason != "" {
				detail += " " + c.Reason
			}
			if c.Message != "" {
				detail += ": " + c.Message
			}
			out = append(out, fmt.Sprintf("node %s is not proven fail-closed (%s %s)", node.Name, names.ConditionFailClosed, detail))
		}
	}
	return out
}

func (o *StatusOptions) emptyMessage() string {
	switch {
	case o.Node != "":
		return fmt.Sprintf("Node %s publishes no NVSwitch domains (no domain size labels such as %s): it has no NVLink domain, or the nvdomain agent does not run there.", o.Node, o.names.DomainSizeLabel(0))
	case o.Selector != "":
		return fmt.Sprintf("No node matching %q publishes NVSwitch domains.", o.Selector)
	}
	return "No node publishes NVSwitch domains: is the nvdomain agent running on the GPU nodes?"
}

// statusList builds the rows from the snapshot, keeping the nodes the filters select; every
// node still counts for the re-pin plan, since a waiter's room may be on a node not shown.
func (o *StatusOptions) statusList(s *snapshot) StatusList {
	list := StatusList{APIVersion: StatusAPIVersion, Kind: StatusKind, Items: []DomainStatus{}}
	list.Pools = o.poolStatus(s)
	for _, c := range s.view.Cliques() {
		list.Cliques = append(list.Cliques, CliqueStatus{ID: c.ID, Nodes: c.Nodes, GPUs: c.GPUs, Free: c.Free, Waiting: c.WaitingGPUs,
			Unavailable: c.UnavailableNodes, Groups: orEmpty(c.Groups)})
	}
	if s.poolsWarning != "" {
		list.Warnings = append(list.Warnings, s.poolsWarning)
	}
	list.Warnings = append(list.Warnings, poolShapeWarnings(s)...)
	type key struct {
		node   string
		domain int
	}
	pods := map[key][]string{}
	for i := range s.pods {
		p := &s.pods[i]
		if !holdsGPUs(p) || (o.namespace != "" && p.Namespace != o.namespace) {
			continue
		}
		if d := rules.Inspect(p, s.names).PinnedDomain(); d >= 0 {
			k := key{p.Spec.NodeName, d}
			pods[k] = append(pods[k], podKey(p))
		}
	}
	for i := range s.pods {
		p := &s.pods[i]
		if p.Spec.NodeName == "" && len(p.Spec.SchedulingGates) > 0 && p.DeletionTimestamp == nil && (p.Status.Phase == "" || p.Status.Phase == corev1.PodPending) &&
			(o.namespace == "" || p.Namespace == o.namespace) && rules.Inspect(p, s.names).PinnedDomain() >= 0 {
			list.Gated = append(list.Gated, podKey(p))
		}
	}
	waiting, stranded := map[key][]string{}, map[key][]string{}
	for _, w := range s.waiters {
		p := s.podByUID(w.ID)
		if p == nil || (o.namespace != "" && p.Namespace != o.namespace) {
			continue
		}
		for _, i := range w.Eligible {
			room := s.rooms[i]
			if room.Capacity[w.Domain] < w.GPUs {
				continue
			}
			k := key{room.Name, w.Domain}
			waiting[k] = append(waiting[k], podKey(p))
			if s.plan[w.ID].Verdict == placement.Stranded {
				stranded[k] = append(stranded[k], podKey(p))
			}
		}
	}
	for i := range s.nodes {
		node := &s.nodes[i]
		if !o.shows(node) {
			continue
		}
		list.Warnings = append(list.Warnings, nodeWarnings(s.names, node)...)
		free := s.view.Free(node.Name)
		dra := node.Labels[s.names.ModeLabel()] == names.ModeDRA
		for _, d := range domainsOf(s.names, node) {
			k := key{node.Name, d.id}
			f := max(0, min(free[d.id], d.size))
			unknown := false
			if dra {
				// A DRA node publishes no domain resources: the allocator counts the driver's
				// devices, so what is used is what the allocated claims hold there.
				if o.draHeld == nil {
					f, unknown = d.size, true
				} else {
					f, pods[k] = draDomainUse(o.draHeld[node.Name], d, o.namespace)
				}
			}
			list.Items = append(list.Items, DomainStatus{
				Node: node.Name, Domain: d.id, Size: d.size, Used: d.size - f, Free: f,
				GPUs: orEmpty(d.gpus), Pods: orEmpty(pods[k]), Waiting: orEmpty(waiting[k]), Stranded: orEmpty(stranded[k]),
				Stale:        node.Labels[s.names.TopologyStaleLabel()] == "true",
				Mismatch:     node.Labels[s.names.TopologyMismatchLabel()] == "true",
				FailClosed:   failClosedOf(node),
				UsageUnknown: unknown,
			})
		}
	}
	return list
}

// draClaimsHeld lists the ResourceClaims and returns, per node, the GPUs of nvdomain's driver
// their allocations hold and, per GPU, the pods (namespace/name) each claim is reserved for;
// admin-access results (monitoring beside the holder) hold nothing. A cluster that serves no
// resource.k8s.io/v1 has no claims; one that refuses the list returns nil and the warning
// that says why the DRA rows' usage is unknown.
func draClaimsHeld(ctx context.Context, c kubernetes.Interface) (map[string]map[int][]string, string, error) {
	list, err := c.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return map[string]map[int][]string{}, "", nil
	case apierrors.IsForbidden(err):
		return nil, "cannot list ResourceClaims (resource.k8s.io), so the GPUs used on DRA nodes are unknown (shown as ?): grant list on resourceclaims in all namespaces", nil
	case err != nil:
		return nil, "", fmt.Errorf("list ResourceClaims: %w", err)
	}
	out := map[string]map[int][]string{}
	for _, rc := range list.Items {
		if rc.Status.Allocation == nil {
			continue
		}
		var holders []string
		for _, ref := range rc.Status.ReservedFor {
			if ref.Resource == "pods" {
				holders = append(holders, rc.Namespace+"/"+ref.Name)
			}
		}
		for _, r := range rc.Status.Allocation.Devices.Results {
			gpus, ok := names.ParseDRADeviceGPUs(r.Device)
			if r.Driver != names.DRADriver || !ok || ptr.Deref(r.AdminAccess, false) {
				continue
			}
			if out[r.Pool] == nil {
				out[r.Pool] = map[int][]string{}
			}
			for _, g := range gpus {
				out[r.Pool][g] = append(out[r.Pool][g], holders...)
			}
		}
	}
	return out, "", nil
}

// draDomainUse is a DRA node's domain as its allocated claims hold it: the GPUs left free and
// the pods holding some (of namespace ns, when set), each once and sorted.
func draDomainUse(held map[int][]string, d nodeDomain, ns string) (int, []string) {
	used := 0
	var pods []string
	for _, g := range d.gpus {
		holders, ok := held[g]
		if !ok {
			continue
		}
		used++
		for _, p := range holders {
			if (ns == "" || strings.HasPrefix(p, ns+"/")) && !slices.Contains(pods, p) {
				pods = append(pods, p)
			}
		}
	}
	slices.Sort(pods)
	return max(0, d.size-used), pods
}

func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// poolStatus lists the declared pools and the pods waiting for each.
func (o *StatusOptions) poolStatus(s *snapshot) []PoolStatus {
	pools := s.view.Pools()
	if len(pools) == 0 {
		return nil
	}
	out := make([]PoolStatus, len(pools))
	at := map[string]int{}
	for i, p := range pools {
		out[i] = PoolStatus{Name: p.Name, NodeSelector: simulated.FormatSelector(p.NodeSelector()), Domains: p.Sizes(), Waiting: []string{}}
		at[p.Name] = i
	}
	for _, p := range s.waiting {
		if o.namespace != "" && p.Namespace != o.namespace {
			continue
		}
		rp := rules.Inspect(p, s.names)
		for _, pool := range s.view.WaitsForPool(p, rp.PinnedDomain(), rp.DomainGPUs()) {
			out[at[pool]].Waiting = append(out[at[pool]].Waiting, podKey(p))
		}
	}
	return out
}

// poolShapeWarnings names the nodes that carry a pool's nodeSelector labels but publish other
// domains than the pool declares: pods waiting for the pool are pinned to domain ids from the
// declared shape, which such nodes may not have (docs/pools.md).
func poolShapeWarnings(s *snapshot) []string {
	var out []string
	for _, p := range s.view.Pools() {
		want := p.Labels()
		for i := range s.nodes {
			nd := &s.nodes[i]
			if _, published := nd.Labels[s.names.DomainCountLabel()]; !published || !simulated.Selects(p.NodeSelector(), nd.Labels) {
				continue
			}
			for _, k := range slices.Sorted(maps.Keys(want)) {
				if v := want[k]; nd.Labels[k] != v {
					out = append(out, fmt.Sprintf("node %s carries pool %s's labels (%s) but publishes %s=%q where the pool declares %q (domain sizes %v): pods waiting for the pool are pinned to domain ids its nodes may not have; declare the shape `nvdomain topology discover` finds on a node of the pool",
						nd.Name, p.Name, simulated.FormatSelector(p.NodeSelector()), k, nd.Labels[k], v, p.Sizes()))
					break
				}
			}
		}
	}
	return out
}

// writePools prints the declared pools under the table.
func writePools(w io.Writer, pools []PoolStatus) error {
	if len(pools) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "POOL\tNODE SELECTOR\tDOMAINS\tWAITING FOR IT")
	for _, p := range pools {
		sizes := make([]string, len(p.Domains))
		for i, s := range p.Domains {
			sizes[i] = strconv.Itoa(s)
		}
		waiting := "-"
		if len(p.Waiting) > 0 {
			waiting = strings.Join(p.Waiting, ", ")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", p.Name, p.NodeSelector, strings.Join(sizes, ","), waiting)
	}
	return tw.Flush()
}

// writeCliques writes the cliques' table, when there are any.
func writeCliques(w io.Writer, cliques []CliqueStatus) error {
	if len(cliques) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CLIQUE	NODES	GPUS	FREE	WAITING	UNAVAILABLE	GROUPS")
	for _, c := range cliques {
		groups := "-"
		if len(c.Groups) > 0 {
			groups = strings.Join(c.Groups, ", ")
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\n", c.ID, c.Nodes, c.GPUs, c.Free, c.Waiting, c.Unavailable, groups)
	}
	return tw.Flush()
}

func writeStatusTable(w io.Writer, list StatusList, wide bool) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	header := "NODE\tDOMAIN\tSIZE\tGPUS USED\tFREE\tPODS\tWAITING\tSTRANDED\tSTALE\tFAIL-CLOSED"
	if wide {
		header += "\tGPU LIST\tPOD NAMES"
	}
	fmt.Fprintln(tw, header)
	for _, it := range list.Items {
		used, free := strconv.Itoa(it.Used), strconv.Itoa(it.Free)
		if it.UsageUnknown {
			used, free = "?", "?"
		}
		row := []string{it.Node, strconv.Itoa(it.Domain), strconv.Itoa(it.Size), used, free,
			strconv.Itoa(len(it.Pods)), strconv.Itoa(len(it.Waiting)), strconv.Itoa(len(it.Stranded)), staleText(it), it.FailClosed}
		if wide {
			row = append(row, kubectlNone(names.FormatGPUList(it.GPUs)), kubectlNone(podNames(it)))
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	return tw.Flush()
}

// kubectlNone prints an empty cell as kubectl's tables do.
func kubectlNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}

// failClosedOf reads the node's NvdomainFailClosed condition.
func failClosedOf(node *corev1.Node) string {
	for _, c := range node.Status.Conditions {
		if c.Type == names.ConditionFailClosed {
			switch c.Status {
			case corev1.ConditionTrue:
				return "yes"
			case corev1.ConditionFalse:
				if c.Reason == names.ReasonRuntimeWithoutValidator {
					return "no: old runtime"
				}
				return "no"
			}
		}
	}
	return "unknown"
}

func staleText(it DomainStatus) string {
	switch {
	case it.Stale && it.Mismatch:
		return "stale,mismatch"
	case it.Stale:
		return "stale"
	case it.Mismatch:
		return "mismatch"
	}
	return "no"
}

// podNames lists the bound pods, then the waiting ones marked as such.
func podNames(it DomainStatus) string {
	out := append([]string{}, it.Pods...)
	stranded := map[string]bool{}
	for _, p := range it.Stranded {
		stranded[p] = true
	}
	for _, p := range it.Waiting {
		if stranded[p] {
			out = append(out, p+"(stranded)")
		} else {
			out = append(out, p+"(waiting)")
		}
	}
	return strings.Join(out, ",")
}

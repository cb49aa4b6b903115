package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/client-go/kubernetes"

	"github.com/nvdomain/nvdomain/pkg/admission"
	"github.com/nvdomain/nvdomain/pkg/kubeevents"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/placement"
	"github.com/nvdomain/nvdomain/pkg/repin"
	"github.com/nvdomain/nvdomain/pkg/rules"
)

// nvdomainReasons are the Event reasons nvdomain records on pods: the NRI plugin's
// (pkg/kubeevents) and the re-pin controller's (webhook/repin).
var nvdomainReasons = []string{
	kubeevents.ReasonGPUsAssigned, kubeevents.ReasonTensorParallelNotPinned,
	repin.ReasonRepinned, repin.ReasonStranded, repin.ReasonRepinSkipped, repin.ReasonRepinGivenUp,
}

// ExplainOptions is `nvdomain explain POD` and `nvdomain explain -f FILE`: kubectl's
// Complete → Validate → Run.
type ExplainOptions struct {
	Factory  ClusterFactory
	Filename string
	// TPSizes and NonTPPods mirror the webhook's --tp-sizes and --non-tp-pods, so that a
	// manifest is judged by the settings the cluster's webhook runs with.
	TPSizes   string
	NonTPPods string
	// Pools is the ConfigMap (namespace/name) declaring the GPU pools; empty: none.
	Pools string

	IOStreams
	namesFromFlags func() (names.Names, error)
	now            func() time.Time

	// Filled by Complete (pod, webhook) and Run (client, namespace).
	pod       string
	client    kubernetes.Interface
	namespace string
	admission admission.Options
}

func newExplain(f ClusterFactory, streams IOStreams) *cobra.Command {
	def := admission.DefaultOptions()
	o := &ExplainOptions{Factory: f, IOStreams: streams, now: time.Now,
		TPSizes: joinInts(def.AllowedTPSizes), NonTPPods: string(def.NonTPPods)}
	cmd := &cobra.Command{
		Use:   "explain (POD | -f FILE)",
		Short: "Say what nvdomain did with a pod and why it is Pending, or what the webhook would do with a manifest",
		Long: `explain POD says what nvdomain did with a pod: its tensor-parallel size, the NVSwitch domain
the webhook pinned it to, that domain's GPUs on the pod's node, the GPUs the node assigned
and their device nodes, and the Events nvdomain recorded on it. For a Pending pod it says
why: which nodes have a domain large enough and how many GPUs each has free, whether the
pinned domain has room, and what the re-pin controller will do (the verdict of its own
plan over the cluster as it is now).

explain -f FILE (YAML or JSON, - for stdin; a Pod, or a Deployment, StatefulSet, ReplicaSet,
Job, CronJob or ReplicationController whose pod template is used) runs the webhook's own
mutating and validating code on each pod against the live cluster, creating nothing, and
prints every violation and warning at once, with the domain the webhook would pin the pod
to now. It exits 1 when the webhook would deny a pod. The webhook breaks ties between equally
good domain ids per request; explain shows the lowest.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.Complete(args); err != nil {
				return err
			}
			if err := o.Validate(); err != nil {
				return err
			}
			return o.Run(cmd.Context())
		},
	}
	fs := cmd.Flags()
	fs.StringVarP(&o.Filename, "filename", "f", "", "manifest to judge as the webhook would (- reads stdin)")
	fs.StringVar(&o.TPSizes, "tp-sizes", o.TPSizes, "the webhook's --tp-sizes: allowed tensor-parallel sizes")
	fs.StringVar(&o.NonTPPods, "non-tp-pods", o.NonTPPods, "the webhook's --non-tp-pods: pin, account or auto")
	fs.StringVar(&o.Pools, "pools-configmap", DefaultPoolsConfigMap, "namespace/name of the ConfigMap declaring the GPU pools that scale from zero (the chart's <release>-pools in its namespace); empty: none")
	f.AddFlags(fs)
	o.namesFromFlags = addNamesFlags(cmd)
	return cmd
}

// Complete reads the arguments and flags. Connecting waits for Run, so that a wrong flag is
// reported before a missing kubeconfig.
func (o *ExplainOptions) Complete(args []string) error {
	if len(args) == 1 {
		o.pod = args[0]
		for _, prefix := range []string{"pod/", "pods/", "po/"} {
			o.pod = strings.TrimPrefix(o.pod, prefix)
		}
	}
	o.admission = admission.DefaultOptions()
	var err error
	if o.admission.Names, err = o.namesFromFlags(); err != nil {
		return fmt.Errorf("--label-prefix/--resource-prefix: %w", err)
	}
	if o.admission.AllowedTPSizes, err = admission.ParseTPSizes(o.TPSizes); err != nil {
		return fmt.Errorf("--tp-sizes: %w", err)
	}
	if o.admission.NonTPPods, err = admission.ParseNonTPMode(o.NonTPPods); err != nil {
		return fmt.Errorf("--non-tp-pods: %w", err)
	}
	return nil
}

// Validate checks that exactly one thing is to be explained.
func (o *ExplainOptions) Validate() error {
	switch {
	case o.pod != "" && o.Filename != "":
		return fmt.Errorf("explain takes a pod name or -f FILE, not both")
	case o.pod == "" && o.Filename == "":
		return fmt.Errorf("explain needs a pod name (nvdomain explain POD -n NAMESPACE) or a manifest (nvdomain explain -f FILE)")
	}
	return nil
}

// Run connects and explains.
func (o *ExplainOptions) Run(ctx context.Context) error {
	var err error
	if o.namespace, _, err = o.Factory.Namespace(); err != nil {
		return err
	}
	if o.client, err = o.Factory.Client(); err != nil {
		return err
	}
	if o.pod != "" {
		pod, err := o.client.CoreV1().Pods(o.namespace).Get(ctx, o.pod, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("pod %s not found in namespace %s: check the name, or pass -n NAMESPACE", o.pod, o.namespace)
		}
		if err != nil {
			return fmt.Errorf("get pod %s/%s: %w", o.namespace, o.pod, err)
		}
		events, err := o.podEvents(ctx, pod)
		if err != nil {
			return err
		}
		return o.explainPod(ctx, pod, events)
	}
	data, err := readInput(o.Filename, o.In)
	if err != nil {
		return err
	}
	pods, err := podsFromManifests(data, o.Filename, o.namespace)
	if err != nil {
		return err
	}
	s, err := loadSnapshot(ctx, o.client, o.admission.Names, o.Pools)
	if err != nil {
		return err
	}
	denied := 0
	for i, mp := range pods {
		if i > 0 {
			fmt.Fprintln(o.Out)
		}
		if o.explainManifestPod(s, mp) {
			denied++
		}
	}
	if denied > 0 {
		return &exitError{code: ExitFindings}
	}
	return nil
}

// podEvents lists the Events nvdomain recorded on the pod, oldest first. The field selector
// spares the apiserver; the filter below is what decides, since not every client honours it.
func (o *ExplainOptions) podEvents(ctx context.Context, pod *corev1.Pod) ([]corev1.Event, error) {
	list, err := o.client.CoreV1().Events(pod.Namespace).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("involvedObject.uid", string(pod.UID)).String(),
	})
	if err != nil {
		return nil, fmt.Errorf("list the Events of pod %s/%s (the command needs list on events): %w", pod.Namespace, pod.Name, err)
	}
	var out []corev1.Event
	for _, ev := range list.Items {
		if ev.InvolvedObject.UID == pod.UID && slices.Contains(nvdomainReasons, ev.Reason) {
			out = append(out, ev)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return eventTime(out[i]).Before(eventTime(out[j])) })
	return out, nil
}

func eventTime(ev corev1.Event) time.Time {
	for _, t := range []time.Time{ev.LastTimestamp.Time, ev.EventTime.Time, ev.FirstTimestamp.Time} {
		if !t.IsZero() {
			return t
		}
	}
	return ev.CreationTimestamp.Time
}

// explainPod writes what nvdomain did with an existing pod.
func (o *ExplainOptions) explainPod(ctx context.Context, pod *corev1.Pod, events []corev1.Event) error {
	n := o.admission.Names
	p := rules.Inspect(pod, n)
	d := p.PinnedDomain()
	_, annotated := pod.Annotations[n.PodDomainAnnotation()]
	pending := pod.Spec.NodeName == "" && pod.DeletionTimestamp == nil && (pod.Status.Phase == "" || pod.Status.Phase == corev1.PodPending)
	var node *corev1.Node
	if pod.Spec.NodeName != "" {
		got, err := o.client.CoreV1().Nodes().Get(ctx, pod.Spec.NodeName, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			// The node is gone; the pod's own annotations still say what it got.
		case err != nil:
			return fmt.Errorf("get node %s of pod %s: %w", pod.Spec.NodeName, podKey(pod), err)
		default:
			node = got
		}
	}

	tw := tabwriter.NewWriter(o.Out, 0, 4, 2, ' ', 0)
	kv := keyValues(tw)
	kv("Pod", "%s", podKey(pod))
	kv("Phase", "%s", phaseText(pod))
	if pod.Spec.NodeName != "" {
		kv("Node", "%s", pod.Spec.NodeName)
	}
	switch {
	case p.TP:
		kv("Tensor-parallel", "yes, %d GPUs", p.GPUs)
	case p.GPUs > 0:
		kv("Tensor-parallel", "no (no %s=%s label); %d %s", names.TPLabel, names.TPLabelValue, p.GPUs, plural(p.GPUs, "GPU", "GPUs"))
	default:
		kv("Tensor-parallel", "no; the pod asks for no %s", names.GPUResource)
	}
	switch {
	case d >= 0 && annotated:
		kv("Domain", "%d, pinned by nvdomain's webhook (%s: %d)", d, n.DomainResource(d), podGPUs(p))
	case d >= 0:
		kv("Domain", "%d, from the pod's own %s resources (nvdomain's webhook did not pin it)", d, n.DomainResource(d))
	case p.TP:
		kv("Domain", "none: tensor-parallel but not pinned (admitted while nvdomain's webhook was down, or outside its selector), so its GPUs may span domains: delete and recreate it")
	case p.GPUs > 0:
		kv("Domain", "none: not tensor-parallel, and the webhook's --non-tp-pods left it unpinned")
	default:
		kv("Domain", "none")
	}
	if d >= 0 && pod.Spec.NodeName != "" {
		o.writeGPUs(kv, n, pod, node, d)
	}
	if p.Group != nil {
		kv("Group", "%s", groupText(pod, p, node, n))
		if c := pod.Annotations[n.PodCliqueAnnotation()]; (c != "" && c != names.CliqueNone) || pod.Annotations[n.PodGroupAnnotation()] != "" {
			kv("IMEX", "%s", imexText(o.client, pod, n))
		}
	}
	if msg := schedulerMessage(pod); msg != "" && pod.Spec.NodeName == "" {
		kv("Scheduler", "%s", msg)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if pending {
		// Only a waiting pod needs the whole cluster: the re-pin plan weighs it against every
		// other waiter and every node.
		s, err := loadSnapshot(ctx, o.client, n, o.Pools)
		if err != nil {
			return err
		}
		fmt.Fprintln(o.Out, "Why Pending:")
		if err := o.whyPending(ctx, s, pod, p); err != nil {
			return err
		}
	}
	return o.writeEvents(events)
}

// groupText says where a LeaderWorkerSet group's pod stands with its multi-node NVLink clique
// (docs/multinode.md).
func groupText(pod *corev1.Pod, p rules.Pod, node *corev1.Node, n names.Names) string {
	g := p.Group
	role := "a worker"
	if g.Leader {
		role = "the leader"
	}
	head := fmt.Sprintf("%s of LeaderWorkerSet group %s (%d pods × %d GPUs)", role, g.Key, g.Size, p.GPUs)
	clique := pod.Annotations[n.PodCliqueAnnotation()]
	if pg := pod.Annotations[n.PodGroupAnnotation()]; pg != "" && clique == "" {
		// --group-placement=workload: the scheduler chooses the clique for the whole group.
		head += fmt.Sprintf("; in PodGroup %s (gang of %d, topology on %s): the scheduler places the whole group in one clique", pg, g.Size, names.GPUCliqueLabel)
		switch {
		case pod.Spec.NodeName == "":
			return head + fmt.Sprintf("; it waits until one clique has room for all of it (`kubectl get podgroup %s -n %s -o yaml` shows the scheduler's conditions)", pg, pod.Namespace)
		case node == nil:
			return head + fmt.Sprintf("; its node %s no longer exists", pod.Spec.NodeName)
		}
		return head + fmt.Sprintf("; on node %s, in clique %s", node.Name, node.Labels[names.GPUCliqueLabel])
	}
	switch {
	case clique == "":
		return head + fmt.Sprintf("; not pinned to an NVLink clique: no node it may run on had the %s label when it was admitted (its pods talk over the network between nodes), or nvdomain's webhook did not admit it", names.GPUCliqueLabel)
	case node == nil && pod.Spec.NodeName == "":
		return head + fmt.Sprintf("; pinned to clique %s with the rest of its group; it waits for room there (`kubectl nvdomain status` lists the cliques)", clique)
	case node == nil:
		return head + fmt.Sprintf("; pinned to clique %s (its node %s no longer exists)", clique, pod.Spec.NodeName)
	case node.Labels[names.GPUCliqueLabel] != clique:
		return head + fmt.Sprintf("; pinned to clique %s, but its node %s is in clique %q now (relabelled after it was scheduled): its group no longer shares one NVLink fabric", clique, node.Name, node.Labels[names.GPUCliqueLabel])
	}
	return head + fmt.Sprintf("; in clique %s with the rest of its group, on node %s", clique, node.Name)
}

// imexText says whether a group pinned to a clique can have the IMEX channel that GPU memory
// shared over NVLink across trays needs: NVIDIA's ComputeDomain API installed, and a claim on
// the pod. nvdomain does not check that a claim is a ComputeDomain's channel.
func imexText(c kubernetes.Interface, pod *corev1.Pod, n names.Names) string {
	installed := false
	if groups, err := c.Discovery().ServerGroups(); err == nil {
		for _, g := range groups.Groups {
			installed = installed || g.Name == names.ComputeDomainGroup
		}
	}
	switch {
	case !installed:
		return fmt.Sprintf("no IMEX channel: NVIDIA's ComputeDomain API (%s.%s, the compute-domain part of NVIDIA's DRA driver for GPUs) is not installed. A group that shares GPU memory over NVLink across trays needs one: install it (nvdomain then gives new groups' pods a channel), or set up IMEX on the hosts",
			names.ComputeDomainResource, names.ComputeDomainGroup)
	case pod.Annotations[n.PodComputeDomainAnnotation()] != "":
		cd := pod.Annotations[n.PodComputeDomainAnnotation()]
		return fmt.Sprintf("a channel from ComputeDomain %s (claim %s, template %s), given by nvdomain; `kubectl get computedomain %s -n %s` says whether it is Ready",
			cd, names.IMEXPodClaim, names.ComputeDomainChannelTemplate(pod.Labels[names.LWSNameLabel]), cd, pod.Namespace)
	case len(pod.Spec.ResourceClaims) == 0:
		return fmt.Sprintf("the pod holds no ResourceClaim: %s is installed, but the pod was admitted before nvdomain saw it, or with the webhook's --imex-channels=false; a group created now gets one (delete the group's leader to recreate the group)", names.ComputeDomainGroup)
	}
	claims := make([]string, 0, len(pod.Spec.ResourceClaims))
	for _, rc := range pod.Spec.ResourceClaims {
		claims = append(claims, rc.Name)
	}
	return fmt.Sprintf("the pod holds claim(s) %s; an IMEX channel comes from a ComputeDomain's claim template (nvdomain does not check which these are)", strings.Join(claims, ", "))
}

// writeGPUs writes the domain's GPUs on the node and what the NRI plugin assigned.
// node is nil when the pod's node no longer exists.
func (o *ExplainOptions) writeGPUs(kv func(k, format string, args ...any), n names.Names, pod *corev1.Pod, node *corev1.Node, d int) {
	var domainGPUs []int
	var err error
	if node != nil {
		domainGPUs, err = names.ParseGPUList(node.Annotations[n.DomainGPUsAnnotation(d)])
	}
	switch {
	case node == nil:
		kv("Domain GPUs", "unknown: node %s no longer exists", pod.Spec.NodeName)
	case err != nil:
		kv("Domain GPUs", "unreadable: node %s's %s annotation: %v", node.Name, n.DomainGPUsAnnotation(d), err)
	case domainGPUs == nil:
		kv("Domain GPUs", "unknown: node %s has no %s annotation (is the nvdomain agent running there?)", node.Name, n.DomainGPUsAnnotation(d))
	default:
		kv("Domain GPUs", "%s (domain %d on node %s)", names.FormatGPUList(domainGPUs), d, node.Name)
	}
	if node != nil && node.Labels[n.TopologyMismatchLabel()] == "true" {
		kv("Topology", "mismatch (%s): the node's NRI plugin serves another topology than the agent publishes, so domain %d may mean other GPUs there", n.TopologyMismatchLabel(), d)
	} else if node != nil && node.Labels[n.TopologyStaleLabel()] == "true" {
		kv("Topology", "stale (%s): the agent's topology source is broken and it publishes its last good topology", n.TopologyStaleLabel())
	}
	value, reported := pod.Annotations[n.PodAssignedGPUsAnnotation()]
	if !reported {
		kv("Assigned GPUs", "not reported yet: the NRI plugin annotates the pod when it creates its containers")
		return
	}
	assigned, err := parseAssigned(value)
	if err != nil {
		kv("Assigned GPUs", "unreadable %s annotation %q: %v", n.PodAssignedGPUsAnnotation(), value, err)
		return
	}
	minors, known := deviceMinors(n, node)
	containers := make([]string, 0, len(assigned))
	for c := range assigned {
		containers = append(containers, c)
	}
	sort.Strings(containers)
	for i, c := range containers {
		gpus := assigned[c]
		devs := make([]string, len(gpus))
		var outside []string
		for j, g := range gpus {
			minor, ok := minors[g]
			if !ok {
				minor = g
			}
			devs[j] = names.GPUDevicePrefix + strconv.Itoa(minor)
			if domainGPUs != nil && !slices.Contains(domainGPUs, g) {
				outside = append(outside, strconv.Itoa(g))
			}
		}
		line := names.FormatGPUList(gpus) + " → " + strings.Join(devs, " ")
		if c != "" {
			line = c + ": " + line
		}
		if len(outside) > 0 {
			line += fmt.Sprintf(" (GPU %s outside domain %d!)", strings.Join(outside, ","), d)
		}
		key := "Assigned GPUs"
		if i > 0 {
			key = "" // a continuation line
		}
		kv(key, "%s", line)
	}
	if !known {
		kv("", "(device minors taken as the GPU indexes: node %s has no readable %s annotation)", pod.Spec.NodeName, n.TopologyAnnotation())
	}
}

// keyValues writes "Key:<tab>value" rows to a tabwriter; an empty key continues the row above.
func keyValues(tw io.Writer) func(k, format string, args ...any) {
	return func(k, format string, args ...any) {
		if k != "" {
			k += ":"
		}
		fmt.Fprintf(tw, "%s\t%s\n", k, fmt.Sprintf(format, args...))
	}
}

func phaseText(pod *corev1.Pod) string {
	phase := string(pod.Status.Phase)
	if phase == "" {
		phase = string(corev1.PodPending)
	}
	switch {
	case pod.DeletionTimestamp != nil:
		phase += ", being deleted"
	case pod.Spec.NodeName == "" && phase == string(corev1.PodPending):
		phase += ", not bound to a node"
	}
	return phase
}

// schedulerMessage is the scheduler's last word on a pod it could not place.
func schedulerMessage(pod *corev1.Pod) string {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return strings.TrimSpace(c.Reason + ": " + c.Message)
		}
	}
	return ""
}

// parseAssigned reads the NRI plugin's assigned-GPUs annotation (nri-plugin/report.go):
// "4,5" for a pod with one GPU container (keyed "" here), else a JSON object of container
// name to such a list.
func parseAssigned(value string) (map[string][]int, error) {
	if !strings.HasPrefix(strings.TrimSpace(value), "{") {
		gpus, err := names.ParseGPUList(value)
		if err != nil {
			return nil, err
		}
		return map[string][]int{"": gpus}, nil
	}
	var per map[string]string
	if err := json.Unmarshal([]byte(value), &per); err != nil {
		return nil, fmt.Errorf("not a JSON object of container name to GPU list: %w", err)
	}
	out := make(map[string][]int, len(per))
	for c, list := range per {
		gpus, err := names.ParseGPUList(list)
		if err != nil {
			return nil, fmt.Errorf("container %s: %w", c, err)
		}
		out[c] = gpus
	}
	return out, nil
}

// whyPending explains an unbound pod from the re-pin controller's own plan over the cluster
// as it is now, with the pod in its place in the queue.
func (o *ExplainOptions) whyPending(ctx context.Context, s *snapshot, pod *corev1.Pod, p rules.Pod) error {
	line := func(format string, args ...any) { fmt.Fprintf(o.Out, "  - "+format+"\n", args...) }
	d := p.PinnedDomain()
	if d < 0 {
		switch {
		case p.TP:
			line("nvdomain never pinned it to a domain, so nothing keeps its %d GPUs in one NVSwitch domain and nvdomain does not re-pin it; delete and recreate it while the webhook runs", p.GPUs)
		default:
			line("nvdomain did not pin it to a domain, so nvdomain is not what keeps it Pending; see the Scheduler line and kubectl describe pod")
		}
		return nil
	}
	if len(pod.Spec.SchedulingGates) > 0 {
		gates := make([]string, len(pod.Spec.SchedulingGates))
		for i, g := range pod.Spec.SchedulingGates {
			gates[i] = g.Name
		}
		line("%s", repin.GatedNote(gates, d, metav1.GetControllerOfNoCopy(pod) == nil))
		return nil
	}
	if pools := s.view.WaitsForPool(pod, d, p.DomainGPUs()); len(pools) > 0 {
		line("it waits for pool %s to scale up: no node it may run on has domain %d with %d GPUs now, and the pool's nodes will; the autoscaler adds one for it (it must know that the pool's nodes offer %s: `nvdomain pools`). If no node comes, check the autoscaler's events on the pod and the pool's NodePool or node group", strings.Join(pools, " or "), d, p.DomainGPUs(), o.admission.Names.DomainResource(d))
		return nil
	}
	if s.poolsWarning != "" {
		line("%s", s.poolsWarning)
	}
	w, pos, ok := s.waiter(string(pod.UID))
	if !ok {
		line("it is pinned to domain %d but not waiting in the re-pin queue (only pods pinned by nvdomain's webhook are)", d)
		return nil
	}
	k := w.GPUs
	eligible := map[int]bool{}
	for _, i := range w.Eligible {
		eligible[i] = true
	}
	// Every node with a domain large enough, and how many GPUs each has free.
	type row struct {
		node          string
		domain, c, f  int
		mayRun        string
		room, ownRoom bool
	}
	var rows []row
	for i, r := range s.rooms {
		ids := make([]int, 0, len(r.Capacity))
		for id := range r.Capacity {
			ids = append(ids, id)
		}
		sort.Ints(ids)
		for _, id := range ids {
			if r.Capacity[id] < k {
				continue
			}
			may := "yes"
			if !eligible[i] {
				may = "no: " + whyNotEligible(s.node(r.Name))
			}
			rows = append(rows, row{node: r.Name, domain: id, c: r.Capacity[id], f: r.Free[id], mayRun: may,
				room: eligible[i] && r.Free[id] >= k, ownRoom: eligible[i] && id == d && r.Free[id] >= k})
		}
	}
	if len(rows) == 0 {
		line("no node has a domain of %d GPUs any more (the webhook admitted it when one had): it waits until such a node returns", k)
	} else {
		line("pinned to domain %d for %d GPUs; nodes with a domain of at least %d GPUs:", d, k, k)
		tw := tabwriter.NewWriter(o.Out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "      NODE\tDOMAIN\tSIZE\tFREE\tMAY RUN THERE")
		for _, r := range rows {
			fmt.Fprintf(tw, "      %s\t%d\t%d\t%d\t%s\n", r.node, r.domain, r.c, r.f, r.mayRun)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	var ownRoom []string
	for _, r := range rows {
		if r.ownRoom {
			ownRoom = append(ownRoom, r.node)
		}
	}
	dec := s.plan[w.ID]
	switch {
	case len(ownRoom) == 0:
		line("domain %d has no room for %d GPUs on any node this pod may run on", d, k)
	case dec.Verdict == placement.WillSchedule:
		line("domain %d has room for it on %s: the scheduler binds it there once its other requests fit (see the Scheduler line)", d, strings.Join(ownRoom, ", "))
	default:
		line("domain %d has %d free GPUs on %s, but the %d %s ahead of it in the queue (higher priority, then older) claim them", d, k, strings.Join(ownRoom, ", "), pos, plural(pos, "pod", "pods"))
	}
	switch {
	case dec.Verdict == placement.WillSchedule && repin.Unschedulable(pod):
		line("re-pin: not needed for its GPUs: %s", repin.BlockedNote(d, repin.SchedulerMessage(pod)))
	case dec.Verdict == placement.WillSchedule:
		line("re-pin: not needed")
	case dec.Soon:
		line("re-pin: none; it waits for domain %d on node %s, where pods being deleted free room for it within their grace period, rather than move to another domain", d, dec.Node)
		return nil
	case dec.Verdict == placement.Stranded:
		line("re-pin: %s", o.strandedVerdict(ctx, pod, dec, k, true))
	default:
		if !repin.Unschedulable(pod) {
			if hyp, ok := s.planAsUnschedulable(w.ID); ok && hyp.Verdict == placement.Stranded {
				line("re-pin: not yet: the scheduler has not reported it Unschedulable; once it does, it %s", o.strandedVerdict(ctx, pod, hyp, k, false))
				return nil
			}
		}
		var claimed []string
		for _, r := range rows {
			if r.room {
				claimed = append(claimed, fmt.Sprintf("domain %d on %s", r.domain, r.node))
			}
		}
		if len(claimed) > 0 {
			line("re-pin: none; it waits: the free room (%s) goes to the %d %s ahead of it in the queue (higher priority, then older), and it runs when %d GPUs of domain %d free up", strings.Join(claimed, ", "), pos, plural(pos, "pod", "pods"), k, d)
			return nil
		}
		line("re-pin: none; it waits: %s", repin.NoRoomAdvice(d, k))
	}
	return nil
}

// whyNotEligible names what keeps the pod off a node: the node's state when it is cordoned or
// NotReady, else the pod's own constraints.
func whyNotEligible(node *corev1.Node) string {
	if node != nil {
		if node.Spec.Unschedulable {
			return "cordoned"
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status != corev1.ConditionTrue {
				return "NotReady"
			}
		}
	}
	return "its node selector, affinity or tolerations"
}

// strandedVerdict says what the re-pin controller does with a stranded pod, by the
// controller's own rules for the scheduler's reason (repin.DomainBlocked) and for its owners
// (repin.WalkOwners), in the words of its Events (repin.StrandedCause and the fixes).
// A pod the scheduler has not judged yet has no reason to read: judged false skips that rule.
func (o *ExplainOptions) strandedVerdict(ctx context.Context, pod *corev1.Pod, dec placement.RepinDecision, gpus int, judged bool) string {
	cause := repin.StrandedCause(dec, gpus, 0)
	if judged && !repin.DomainBlocked(pod, o.admission.Names) {
		return fmt.Sprintf("stranded: %s; it will not be re-pinned: %s (see the Scheduler line)", cause, repin.NotDomainNote)
	}
	if metav1.GetControllerOfNoCopy(pod) == nil {
		return fmt.Sprintf("stranded: %s; %s. %s", cause, repin.BarePodNote, repin.StrandedFix(dec, true))
	}
	owners := repin.WalkOwners(ctx, pod, repin.DefaultOwnerKinds, apiOwners{o.client})
	if owners.Skip == "" {
		return fmt.Sprintf("will be re-pinned to domain %d (room on node %s) after the re-pin delay (--repin-after, %s by default): nvdomain evicts it, its %s recreates it, and the webhook pins the replacement to a domain with room",
			dec.To, dec.Node, repin.DefaultOptions().After, owners.Describe())
	}
	return fmt.Sprintf("stranded: %s; it will not be re-pinned: %s. %s", cause, owners.Skip, repin.SkipFix(owners, dec))
}

// apiOwners reads a pod's owners for repin.OwnerSkipReason straight from the API server.
type apiOwners struct{ c kubernetes.Interface }

func (a apiOwners) Meta(ctx context.Context, namespace string, gvk schema.GroupVersionKind, name string) (metav1.Object, error) {
	get := metav1.GetOptions{}
	var obj metav1.Object
	var err error
	switch gvk.Kind {
	case "ReplicaSet":
		obj, err = a.c.AppsV1().ReplicaSets(namespace).Get(ctx, name, get)
	case "StatefulSet":
		obj, err = a.c.AppsV1().StatefulSets(namespace).Get(ctx, name, get)
	case "Deployment":
		obj, err = a.c.AppsV1().Deployments(namespace).Get(ctx, name, get)
	case "ReplicationController":
		obj, err = a.c.CoreV1().ReplicationControllers(namespace).Get(ctx, name, get)
	case "Job":
		obj, err = a.c.BatchV1().Jobs(namespace).Get(ctx, name, get)
	case "CronJob":
		obj, err = a.c.BatchV1().CronJobs(namespace).Get(ctx, name, get)
	case "Pod":
		obj, err = a.c.CoreV1().Pods(namespace).Get(ctx, name, get)
	default:
		return nil, fmt.Errorf("cannot read a %s", gvk.Kind)
	}
	if err != nil {
		return nil, err
	}
	return obj, nil
}

func (a apiOwners) IgnoresDisruption(ctx context.Context, meta metav1.Object) (bool, error) {
	job, err := a.c.BatchV1().Jobs(meta.GetNamespace()).Get(ctx, meta.GetName(), metav1.GetOptions{})
	if err != nil {
		return false, err
	}
	return repin.IgnoresDisruption(job), nil
}

// writeEvents prints nvdomain's Events on the pod.
func (o *ExplainOptions) writeEvents(events []corev1.Event) error {
	if len(events) == 0 {
		_, err := fmt.Fprintln(o.Out, "Events from nvdomain: <none>")
		return err
	}
	fmt.Fprintln(o.Out, "Events from nvdomain:")
	tw := tabwriter.NewWriter(o.Out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  AGE\tTYPE\tREASON\tFROM\tMESSAGE")
	for _, ev := range events {
		from := ev.Source.Component
		if from == "" {
			from = ev.ReportingController
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", duration.HumanDuration(o.now().Sub(eventTime(ev))), ev.Type, ev.Reason, orDash(from), ev.Message)
	}
	return tw.Flush()
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}

package localcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/nvdomain/nvdomain/pkg/dra"
	"github.com/nvdomain/nvdomain/pkg/names"
)

// DRADay2Report is what the DRA driver's day-2 scenarios found (RunDRADay2).
type DRADay2Report struct {
	// (h) The kubelet restarted between a claim's Prepare and its Unprepare: the pod deleted
	// after the restart, its Replacement, and the claims the driver's checkpoint holds at the
	// end against the claims allocated on the node (by UID: they must be the same).
	Replacement                 PodResult
	CheckpointClaims, Allocated []string
	// (i) A pod force-deleted while the kubelet was down and lost its DRA state: its claim is
	// gone, and the driver's checkpoint entry for it is dropped by housekeeping StaleRemoved
	// after the claim was deleted; AfterStale ran on its GPUs afterwards.
	StaleClaim   string
	StaleRemoved time.Duration
	AfterStale   PodResult
	// (j) A device plugin advertises nvidia.com/gpu on the DRA node: the driver withdraws its
	// devices (SliceDevices while withdrawn), sets the Node condition and records an Event;
	// a TP pod created meanwhile waits (WithdrawnPending), and runs once the resource is gone
	// (Republished: the devices published again).
	WithdrawnDevices int
	Condition, Event string
	WithdrawnPending string
	Republished      int
	AfterWithdrawal  PodResult
	// (k) GPU 5 is unhealthy: its device carries Taint; a TP=4 pod runs elsewhere
	// (HealthyTP4), a second waits (UnhealthyPending) until the GPU is healthy again and then
	// runs in the other domain (Recovered); Status is `nvdomain status` meanwhile.
	Taint            string
	HealthyTP4       PodResult
	UnhealthyPending string
	Recovered        PodResult
	Status           string
}

// RunDRADay2 runs the DRA driver's day-2 scenarios after RunDRAScenarios (whose report gives
// the topology and records the claims), on the cluster as that left it: the llama Deployment's
// two TP=4 pods running, one per domain.
func (c *Cluster) RunDRADay2(ctx context.Context, w io.Writer, rep *DRAReport) (*DRADay2Report, error) {
	cs, err := c.client()
	if err != nil {
		return nil, err
	}
	out := &DRADay2Report{}
	say := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	checkpoint := filepath.Join(c.path("kubelet"), "plugins", names.DRADriver, dra.CheckpointFile)

	say("\n== (h) the kubelet restarts between a claim's Prepare and its Unprepare")
	before, err := c.draRunning(ctx, cs, "app=llama", 2, rep)
	if err != nil {
		return out, err
	}
	if err := c.RestartKubelet(ctx, nil); err != nil {
		return out, err
	}
	say("  restarted the kubelet; llama pods %s still run", podList(before))
	victim := before[0].Name
	if _, _, err := c.Kubectl("delete", "pod", victim, "--wait=true"); err != nil {
		return out, err
	}
	say("$ kubectl delete pod %s   # the new kubelet unprepares its claim", victim)
	after, err := c.draRunning(ctx, cs, "app=llama", 2, rep)
	if err != nil {
		return out, err
	}
	for _, p := range after {
		if p.Name != before[0].Name && p.Name != before[1].Name {
			out.Replacement = p
		}
	}
	if out.CheckpointClaims, out.Allocated, err = c.claimsHeld(ctx, cs, checkpoint); err != nil {
		return out, err
	}
	say("  replacement %s runs on GPUs %s; the driver's checkpoint holds %d claims, %d are allocated on the node",
		out.Replacement.Name, names.FormatGPUList(out.Replacement.GPUs), len(out.CheckpointClaims), len(out.Allocated))

	say("\n== (i) a pod force-deleted while the kubelet is down and loses its DRA state: the stale entry is dropped by housekeeping")
	if _, errOut, err := c.Kubectl("scale", "deployment/llama", "--replicas=1"); err != nil {
		return out, fmt.Errorf("scale llama: %v: %s", err, errOut)
	}
	if _, err := c.draRunning(ctx, cs, "app=llama", 1, rep); err != nil {
		return out, err
	}
	if err := c.waitPodsGone(ctx, cs, "app=llama", 1); err != nil {
		return out, err
	}
	if err := c.createTP(ctx, cs, "stale-tp2", 2); err != nil {
		return out, err
	}
	stale, err := c.draRunning(ctx, cs, "app=stale-tp2", 1, rep)
	if err != nil {
		return out, err
	}
	claim, err := podClaim(ctx, cs, stale[0].Name)
	if err != nil {
		return out, err
	}
	out.StaleClaim = claim.Namespace + "/" + claim.Name
	var claimGone time.Time
	err = c.RestartKubelet(ctx, func() error {
		if _, errOut, err := c.Kubectl("delete", "pod", stale[0].Name, "--force", "--grace-period=0"); err != nil {
			return fmt.Errorf("force-delete %s: %v: %s", stale[0].Name, err, errOut)
		}
		// The resourceclaim controller deletes the pod's claim once the pod is gone.
		if err := waitUntil(ctx, 60*time.Second, "claim "+out.StaleClaim+" deleted", func() bool {
			_, err := cs.ResourceV1().ResourceClaims(claim.Namespace).Get(ctx, claim.Name, metav1.GetOptions{})
			return apierrors.IsNotFound(err)
		}); err != nil {
			return err
		}
		claimGone = time.Now()
		// What a kubelet that lost track of its claims leaves: it will never unprepare this one.
		return os.Remove(filepath.Join(c.path("kubelet"), "dra_manager_state"))
	})
	if err != nil {
		return out, err
	}
	say("  force-deleted %s with the kubelet down, its claim %s deleted, the kubelet's dra_manager_state removed; kubelet back", stale[0].Name, out.StaleClaim)
	// A round finds the entry stale within a period, the round StaleGrace later drops it; a
	// read of the apiserver that fails puts that off by a period: four periods is ample.
	if err := waitUntil(ctx, 4*dra.DefaultHousekeepingPeriod, "the driver to drop the stale entry of "+out.StaleClaim, func() bool {
		cp, err := dra.ReadCheckpoint(checkpoint)
		return err == nil && !slices.Contains(checkpointUIDs(cp), string(claim.UID))
	}); err != nil {
		return out, err
	}
	out.StaleRemoved = time.Since(claimGone)
	say("  the driver dropped the entry %s after the claim was deleted (housekeeping every %s; a stale entry goes %s after a round finds it)", out.StaleRemoved.Round(time.Second), dra.DefaultHousekeepingPeriod, dra.StaleGrace)
	if err := c.createTP(ctx, cs, "after-stale", 2); err != nil {
		return out, err
	}
	got, err := c.draRunning(ctx, cs, "app=after-stale", 1, rep)
	if err != nil {
		return out, err
	}
	out.AfterStale = got[0]
	say("  after-stale then runs on GPUs %s", names.FormatGPUList(out.AfterStale.GPUs))

	say("\n== (j) a device plugin advertises nvidia.com/gpu on the DRA node: the driver withdraws its devices")
	if _, _, err := c.Kubectl("delete", "pod", "after-stale", "--wait=true"); err != nil {
		return out, err
	}
	add := fmt.Sprintf(`{"status":{"capacity":{%q:"8"},"allocatable":{%q:"8"}}}`, names.GPUResource, names.GPUResource)
	if _, errOut, err := c.Kubectl("patch", "node", NodeName, "--subresource=status", "--type=merge", "-p", add); err != nil {
		return out, fmt.Errorf("advertise nvidia.com/gpu: %v: %s", err, errOut)
	}
	say("$ kubectl patch node %s --subresource=status ... capacity nvidia.com/gpu: 8   # what a device plugin's registration does", NodeName)
	if err := waitUntil(ctx, 3*dra.DefaultHousekeepingPeriod, "the driver to withdraw its devices", func() bool {
		out.WithdrawnDevices = c.sliceDevices()
		out.Condition = c.nodeCondition(names.ConditionDRADevices)
		out.Event = c.nodeEvent(names.ReasonDevicePluginOnDRANode)
		return out.WithdrawnDevices == 0 && strings.HasPrefix(out.Condition, "False "+names.ReasonDevicePluginOnDRANode) && out.Event != ""
	}); err != nil {
		return out, fmt.Errorf("%w: %d devices, condition %q, event %q", err, out.WithdrawnDevices, out.Condition, out.Event)
	}
	say("  devices published: %d; condition %s; event: %s", out.WithdrawnDevices, out.Condition, out.Event)
	if err := c.createTP(ctx, cs, "while-withdrawn", 2); err != nil {
		return out, err
	}
	if out.WithdrawnPending, err = c.waitUnschedulable(ctx, cs, "while-withdrawn"); err != nil {
		return out, err
	}
	say("  while-withdrawn waits: %s", out.WithdrawnPending)
	remove := fmt.Sprintf(`[{"op":"remove","path":"/status/capacity/%s"},{"op":"remove","path":"/status/allocatable/%s"}]`,
		strings.ReplaceAll(names.GPUResource, "/", "~1"), strings.ReplaceAll(names.GPUResource, "/", "~1"))
	if _, errOut, err := c.Kubectl("patch", "node", NodeName, "--subresource=status", "--type=json", "-p", remove); err != nil {
		return out, fmt.Errorf("withdraw nvidia.com/gpu: %v: %s", err, errOut)
	}
	say("$ kubectl patch node %s --subresource=status ... remove nvidia.com/gpu   # the device plugin is gone", NodeName)
	if err := waitUntil(ctx, 3*dra.DefaultHousekeepingPeriod, "the driver to publish its devices again", func() bool {
		out.Republished = c.sliceDevices()
		return out.Republished == 8 && strings.HasPrefix(c.nodeCondition(names.ConditionDRADevices), "True")
	}); err != nil {
		return out, err
	}
	if got, err = c.draRunning(ctx, cs, "app=while-withdrawn", 1, rep); err != nil {
		return out, err
	}
	out.AfterWithdrawal = got[0]
	say("  devices published again: %d; while-withdrawn runs on GPUs %s", out.Republished, names.FormatGPUList(out.AfterWithdrawal.GPUs))

	say("\n== (k) GPU 5 is unhealthy: its device is tainted, and TP pods land elsewhere")
	if _, errOut, err := c.Kubectl("scale", "deployment/llama", "--replicas=0"); err != nil {
		return out, fmt.Errorf("scale llama: %v: %s", err, errOut)
	}
	if _, _, err := c.Kubectl("delete", "pod", "while-withdrawn", "--wait=true"); err != nil {
		return out, err
	}
	if err := c.waitPodsGone(ctx, cs, "app=llama", 0); err != nil {
		return out, err
	}
	if err := c.setGPUHealth(ctx, cs, 5, "XID 79: GPU has fallen off the bus"); err != nil {
		return out, err
	}
	say("$ kubectl edit configmap -n nvdomain-system nvdomain-topology   # GPU 5: health \"XID 79: GPU has fallen off the bus\"")
	if err := waitUntil(ctx, 3*time.Minute, "the driver to taint gpu-5", func() bool {
		out.Taint = c.deviceTaint("gpu-5")
		return out.Taint != ""
	}); err != nil {
		return out, err
	}
	say("  gpu-5 taint: %s", out.Taint)
	out.Status, _ = c.NVDomain(ctx, "status")
	say("$ nvdomain status\n%s", strings.TrimSpace(out.Status))
	if err := c.createTP(ctx, cs, "healthy-tp4", 4); err != nil {
		return out, err
	}
	if got, err = c.draRunning(ctx, cs, "app=healthy-tp4", 1, rep); err != nil {
		return out, err
	}
	out.HealthyTP4 = got[0]
	say("  healthy-tp4 runs on GPUs %s (domain %s)", names.FormatGPUList(out.HealthyTP4.GPUs), out.HealthyTP4.Domain)
	if err := c.createTP(ctx, cs, "second-tp4", 4); err != nil {
		return out, err
	}
	if out.UnhealthyPending, err = c.waitUnschedulable(ctx, cs, "second-tp4"); err != nil {
		return out, err
	}
	say("  second-tp4 waits: %s", out.UnhealthyPending)
	if err := c.setGPUHealth(ctx, cs, 5, ""); err != nil {
		return out, err
	}
	say("$ kubectl edit configmap ...   # GPU 5 healthy again")
	if got, err = c.draRunning(ctx, cs, "app=second-tp4", 1, rep); err != nil {
		return out, err
	}
	out.Recovered = got[0]
	say("  second-tp4 runs on GPUs %s (domain %s)", names.FormatGPUList(out.Recovered.GPUs), out.Recovered.Domain)
	return out, nil
}

// claimsHeld are the claim UIDs the driver's checkpoint holds and those of the ResourceClaims
// allocated devices of the driver on the node, both sorted.
func (c *Cluster) claimsHeld(ctx context.Context, cs *kubernetes.Clientset, checkpoint string) (held, allocated []string, err error) {
	cp, err := dra.ReadCheckpoint(checkpoint)
	if err != nil {
		return nil, nil, err
	}
	list, err := cs.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("list ResourceClaims: %w", err)
	}
	for _, rc := range list.Items {
		if rc.Status.Allocation == nil || rc.DeletionTimestamp != nil {
			continue
		}
		for _, r := range rc.Status.Allocation.Devices.Results {
			if r.Driver == names.DRADriver && r.Pool == NodeName {
				allocated = append(allocated, string(rc.UID))
				break
			}
		}
	}
	slices.Sort(allocated)
	return checkpointUIDs(cp), allocated, nil
}

func checkpointUIDs(cp *dra.Checkpoint) []string {
	var out []string
	for uid := range cp.Claims {
		out = append(out, string(uid))
	}
	slices.Sort(out)
	return out
}

// claimRef names a ResourceClaim.
type claimRef struct {
	Namespace, Name string
	UID             types.UID
}

// createTP creates a TP pod of k GPUs labelled app=name in the default namespace.
func (c *Cluster) createTP(ctx context.Context, cs *kubernetes.Clientset, name string, k int64) error {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: tpLabels(name)}, Spec: tpPodSpec(k)}
	_, err := cs.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{})
	return err
}

// podClaim is the ResourceClaim the resourceclaim controller made for a pod's template claim.
func podClaim(ctx context.Context, cs *kubernetes.Clientset, pod string) (claimRef, error) {
	var out claimRef
	p, err := cs.CoreV1().Pods("default").Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		return out, err
	}
	for _, st := range p.Status.ResourceClaimStatuses {
		if st.ResourceClaimName == nil {
			continue
		}
		rc, err := cs.ResourceV1().ResourceClaims("default").Get(ctx, *st.ResourceClaimName, metav1.GetOptions{})
		if err != nil {
			return out, err
		}
		out.Namespace, out.Name, out.UID = rc.Namespace, rc.Name, rc.UID
		return out, nil
	}
	return out, fmt.Errorf("pod %s has no ResourceClaim", pod)
}

// waitPodsGone waits until at most want pods match selector, none of them being deleted.
func (c *Cluster) waitPodsGone(ctx context.Context, cs *kubernetes.Clientset, selector string, want int) error {
	return waitUntil(ctx, 90*time.Second, fmt.Sprintf("at most %d pods %s", want, selector), func() bool {
		list, err := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false
		}
		for _, p := range list.Items {
			if p.DeletionTimestamp != nil {
				return false
			}
		}
		return len(list.Items) <= want
	})
}

// sliceDevices counts the devices the driver publishes in its ResourceSlices.
func (c *Cluster) sliceDevices() int {
	devs, _, _ := c.Kubectl("get", "resourceslices", "-o", `jsonpath={range .items[?(@.spec.driver=="gpu.nvdomain.io")]}{range .spec.devices[*]}{.name}{" "}{end}{end}`)
	return len(strings.Fields(devs))
}

// deviceTaint is a published device's taints as "key:effect" ("" for none).
func (c *Cluster) deviceTaint(device string) string {
	out, _, _ := c.Kubectl("get", "resourceslices", "-o",
		fmt.Sprintf(`jsonpath={range .items[?(@.spec.driver=="gpu.nvdomain.io")]}{range .spec.devices[?(@.name=="%s")]}{range .taints[*]}{.key}:{.effect} {end}{end}{end}`, device))
	return strings.TrimSpace(out)
}

// nodeCondition is the node's condition of that type as "status reason: message".
func (c *Cluster) nodeCondition(kind string) string {
	out, _, _ := c.Kubectl("get", "node", NodeName, "-o",
		fmt.Sprintf(`jsonpath={range .status.conditions[?(@.type=="%s")]}{.status} {.reason}: {.message}{end}`, kind))
	return strings.TrimSpace(out)
}

// nodeEvent is the message of the newest Event of that reason on the node ("" for none).
func (c *Cluster) nodeEvent(reason string) string {
	out, _, _ := c.Kubectl("get", "events", "-A", "--field-selector", "involvedObject.kind=Node,reason="+reason, "-o",
		`jsonpath={range .items[*]}{.type} {.message}{"\n"}{end}`)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// setGPUHealth sets one GPU's health ("" for healthy) in the simulated topology's ConfigMap
// (withGPUHealth). The kubelet projects the ConfigMap into the agent's volume and the agent
// republishes.
func (c *Cluster) setGPUHealth(ctx context.Context, cs *kubernetes.Clientset, gpu int, health string) error {
	cm, err := cs.CoreV1().ConfigMaps("nvdomain-system").Get(ctx, "nvdomain-topology", metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("the simulated topology's ConfigMap: %w", err)
	}
	data, err := withGPUHealth([]byte(cm.Data["topology.json"]), NodeName, gpu, health)
	if err != nil {
		return err
	}
	cm.Data["topology.json"] = string(data)
	if _, err := cs.CoreV1().ConfigMaps("nvdomain-system").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update the simulated topology: %w", err)
	}
	return nil
}

// withGPUHealth is a simulated topology document with one GPU's health set ("" for healthy)
// in node's entry, the rest kept; an entry that counts its GPUs (gpuCount) gets them listed one
// by one, so that the field has a place.
func withGPUHealth(in []byte, node string, gpu int, health string) ([]byte, error) {
	var doc struct {
		Nodes []map[string]any `json:"nodes"`
	}
	if err := json.Unmarshal(in, &doc); err != nil {
		return nil, fmt.Errorf("the simulated topology: %w", err)
	}
	set := false
	for _, nd := range doc.Nodes {
		if nd["name"] != node {
			continue
		}
		var gpus []map[string]any
		if list, ok := nd["gpus"].([]any); ok {
			for _, g := range list {
				if m, ok := g.(map[string]any); ok {
					gpus = append(gpus, m)
				}
			}
		} else if count, ok := nd["gpuCount"].(float64); ok {
			for i := range int(count) {
				gpus = append(gpus, map[string]any{"index": float64(i)}) // as JSON decodes numbers
			}
		}
		delete(nd, "gpuCount")
		for _, g := range gpus {
			if idx, ok := g["index"].(float64); ok && int(idx) == gpu {
				set = true
				delete(g, "health")
				if health != "" {
					g["health"] = health
				}
			}
		}
		nd["gpus"] = gpus
	}
	if !set {
		return nil, fmt.Errorf("the simulated topology has no GPU %d on node %s", gpu, node)
	}
	return json.Marshal(doc)
}

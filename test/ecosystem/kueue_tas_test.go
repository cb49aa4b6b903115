package ecosystem

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/nvdomain/nvdomain/pkg/names"
	prepin "github.com/nvdomain/nvdomain/pkg/repin"
	"github.com/nvdomain/nvdomain/pkg/rules"
	"github.com/nvdomain/nvdomain/test/hacluster"
)

// tasPodSetAnnotation asks Kueue's Topology-Aware Scheduling to place a pod set within one
// value of a node label (here: one node).
const tasPodSetAnnotation = "kueue.x-k8s.io/podset-required-topology"

// TestTPPodsPlacedByKueueTAS runs Kueue's Topology-Aware Scheduling (on by default since
// Kueue v0.14) beside nvdomain. TAS picks the node and injects it as a nodeSelector when it
// ungates the pod; nvdomain pinned the domain id at creation. The two agree only if TAS
// counts the per-domain resource: so the TAS ClusterQueue covers
// nvidia.com/nvswitch-domain-<id> (docs/ecosystem.md) instead of Kueue excluding it, and TAS
// then picks a node with room in the pinned domain.
//
// Two nodes of two 4-GPU domains are filled crosswise by pods outside Kueue (which TAS counts
// as usage on their nodes): each node keeps room in a different domain id only, so
// either node has 4 free GPUs but only one has room in a given domain. Two queued TP=4
// Deployments, each pinned at creation to one of the two ids, must each run on the node TAS
// chose (the nodeSelector it injected) and in the domain nvdomain pinned.
func TestTPPodsPlacedByKueueTAS(t *testing.T) {
	kueueDir := buildTool(t, "build-kueue.sh")
	c, dyn := startCluster(t, "replicaset", "deployment", "garbagecollector")
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Minute)
	defer cancel()
	for _, name := range []string{"gpu-0", "gpu-1"} {
		publishNode(ctx, t, c, name, [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}})
	}
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Crosswise: one pod on gpu-0 takes a domain; two on gpu-1 take both, then the one in the
	// same domain id as gpu-0's ends.
	for i, node := range []string{"gpu-0", "gpu-1", "gpu-1"} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("hog-%d", i), Namespace: ns, Labels: map[string]string{names.TPLabel: names.TPLabelValue, "app": "hog"}},
			Spec: podTemplate("hog", 4).Spec}
		p.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": node}
		if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitRunning(ctx, t, c, dyn, "app=hog", i+1)
	}
	hogs := waitRunning(ctx, t, c, dyn, "app=hog", 3)
	x := -1 // the domain the hog on gpu-0 holds
	for _, h := range hogs {
		if h.Spec.NodeName == "gpu-0" {
			x = rules.Inspect(&h, n).PinnedDomain()
		}
	}
	for _, h := range hogs {
		if h.Spec.NodeName == "gpu-1" && rules.Inspect(&h, n).PinnedDomain() == x {
			if err := c.Client.CoreV1().Pods(ns).Delete(ctx, h.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))}); err != nil {
				t.Fatal(err)
			}
		}
	}
	hogs = waitRunning(ctx, t, c, dyn, "app=hog", 2)
	// Room: gpu-0 in domain 1-x only, gpu-1 in domain x only.
	roomOn := map[int]string{1 - x: "gpu-0", x: "gpu-1"}
	t.Logf("pods outside Kueue: %s; room for TP=4 in domain %d on gpu-0 only, in domain %d on gpu-1 only", describeDomains(hogs), 1-x, x)

	k := installKueue(ctx, t, c, kueueDir)
	// No exclusion: TAS must count the per-domain resource.
	startKueue(k, false, kueueFrameworks...)
	hacluster.ApplyYAML(ctx, t, dyn, fmt.Sprintf(`apiVersion: kueue.x-k8s.io/v1beta2
kind: Topology
metadata:
  name: hosts
spec:
  levels:
  - nodeLabel: kubernetes.io/hostname
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata:
  name: tas
spec:
  nodeLabels:
    %[3]s: "2"
  topologyName: hosts
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata:
  name: gpus
spec:
  namespaceSelector: {}
  resourceGroups:
  - coveredResources: [cpu, memory, nvidia.com/gpu, %[4]s, %[5]s]
    flavors:
    - name: tas
      resources:
      - {name: cpu, nominalQuota: "64"}
      - {name: memory, nominalQuota: 512Gi}
      - {name: nvidia.com/gpu, nominalQuota: "16"}
      - {name: %[4]s, nominalQuota: "8"}
      - {name: %[5]s, nominalQuota: "8"}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata:
  name: %[1]s
  namespace: %[2]s
spec:
  clusterQueue: gpus
`, queue, ns, n.DomainCountLabel(), n.DomainResource(0), n.DomainResource(1)))

	for _, app := range []string{"tas-a", "tas-b"} {
		d := deployment(t, app)
		d.Spec.Template.Annotations = map[string]string{tasPodSetAnnotation: "kubernetes.io/hostname"}
		if _, err := c.Client.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		p := waitRunning(ctx, t, c, dyn, "app="+app, 1)[0]
		checkOneDomain(ctx, t, c, &p, 4)
		chose := p.Spec.NodeSelector["kubernetes.io/hostname"]
		dom := rules.Inspect(&p, n).PinnedDomain()
		t.Logf("%s: pinned to domain %d, TAS chose node %q, runs on %s", p.Name, dom, chose, p.Spec.NodeName)
		if chose == "" || p.Spec.NodeName != chose {
			t.Errorf("%s runs on %s, but TAS chose %q (nodeSelector %v)", p.Name, p.Spec.NodeName, chose, p.Spec.NodeSelector)
		}
		if want := roomOn[dom]; chose != want {
			t.Errorf("%s pinned to domain %d, which has room only on %s, but TAS chose %q", p.Name, dom, want, chose)
		}
	}
	// Agreement, not repair: had TAS chosen against the pin, the re-pin controller would have
	// replaced the pod until the two agreed, and the checks above would pass all the same.
	if repins := countEvents(ctx, t, c, prepin.ReasonRepinned, "Pod"); repins != 0 {
		t.Errorf("%d Repinned Events: TAS placed a pod against its pin, and nvdomain moved it", repins)
	}
	if ev := findEvent(ctx, t, c, "Pod", "", prepin.ReasonStranded); ev != "" {
		t.Errorf("a pod was stranded: %s", ev)
	}
	// `nvdomain status` takes the covered per-domain resources for the TAS configuration they
	// are, not for a missing exclusion.
	setKueueConfigMap(ctx, t, c, kueueConfig(k, false, kueueFrameworks...))
	if status := nvdomainStatus(ctx, t, c); strings.Contains(status, "Kueue") {
		t.Errorf("nvdomain status warns about the TAS configuration docs/ecosystem.md gives:\n%s", status)
	}
}

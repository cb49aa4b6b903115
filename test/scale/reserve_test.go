package scale

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/nvdomain/nvdomain/pkg/dra"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/topology/simulated"
	"github.com/nvdomain/nvdomain/test/hacluster"
)

// TestReservationsKeepADomainForAStrandedTPPod runs reservations without pins on the real
// kube-scheduler, kube-controller-manager and two webhook replicas with --dra-reservations, on
// one kwok node with two 4-GPU domains (kwok runs no kubelet, so the test publishes the node's
// slices as the driver does: dra.Resources with dra.NodeReservations of the node's key in the
// ConfigMap the elected replica writes).
//
//  1. Holder pods take GPUs 2 and 3 (domain 0, two holders) and GPU 7 (domain 1, one holder):
//     five GPUs free, none four in one domain. A TP=4 pod waits, stranded by fragmentation.
//  2. The elected replica reserves domain 1 for it (the fewest holders); the driver's slices
//     taint its devices gpu.nvdomain.io/reserved=4.
//  3. A TP=2 pod then goes to domain 0, although the allocator's first fit (of two equal
//     domains, the higher id first, from its highest free index down) is in domain 1: without
//     the reservation it takes GPUs 6 and 5 there.
//  4. Once the reserved domain's holder ends, the TP=4 pod gets the whole domain (its template
//     tolerates the taint), and the reservation ends.
func TestReservationsKeepADomainForAStrandedTPPod(t *testing.T) {
	start := time.Now()
	cfg := Config{Split: 1, Lifetime: time.Hour, Mix: [4]int{0, 100, 0, 0}, KwokPodWorkers: 4}
	c := hacluster.Start(t, hacluster.Options{
		Replicas: 2, AlsoBuild: []string{fleetPackage}, KwokFinishesDeletions: true,
		WebhookArgs: []string{"--tp-sizes=1,2,4,8", "--mode=mixed", "--dra-templates", "--dra-reservations",
			"--dra-reservation-ttl=1m", "--dra-reservation-interval=1s"},
		Controllers:           []string{"replicaset", "garbagecollector", "resourceclaim-controller"},
		SchedulerArgs:         schedulerArgs,
		ControllerManagerArgs: []string{"--kube-api-qps=500", "--kube-api-burst=1000"},
	})
	ctx := context.Background()
	fleet := startFleet(t, c, cfg, start)
	domains, _, err := publishDRA(ctx, c.Client, fleet.doc, false)
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil || len(nodes.Items) != 1 {
		t.Fatalf("nodes: %v, %v", nodes, err)
	}
	node := nodes.Items[0].Name
	if err := waitAdmitsDRA(ctx, c.Client, 4); err != nil {
		t.Fatalf("%v\n%s", err, c.ReplicaLogs())
	}
	const ns = "reserve"
	if err := createWithTemplates(ctx, c.Client, ns); err != nil {
		t.Fatalf("%v\n%s", err, c.ReplicaLogs())
	}
	tp4, err := c.Client.ResourceV1().ResourceClaimTemplates(ns).Get(ctx, names.DRATemplate(4), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if tols := tp4.Spec.Spec.Devices.Requests[0].Exactly.Tolerations; len(tols) != 1 || tols[0].Key != names.DRATaintReserved || tols[0].Value != "4" {
		t.Fatalf("nvdomain-tp-4 tolerates %+v, want %s=4", tols, names.DRATaintReserved)
	}

	// The driver's part: the node's slices follow its key of the ConfigMap.
	drv, err := newSliceDriver(fleet.doc)
	if err != nil {
		t.Fatal(err)
	}
	stopDriver := make(chan struct{})
	defer close(stopDriver)
	go drv.follow(ctx, t, c.Client, node, stopDriver)

	// 1. Holders on GPUs 2, 3 and 7, the waiter.
	for _, gpu := range []int{2, 3, 7} {
		if err := createHolder(ctx, c.Client, ns, gpu); err != nil {
			t.Fatal(err)
		}
	}
	for _, gpu := range []int{2, 3, 7} {
		waitClaimDevices(ctx, t, c.Client, ns, fmt.Sprintf("holder-%d", gpu), []string{names.DRADeviceName(gpu)})
	}
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, draPod("waiter", 4), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// 2. A domain is reserved for it and published tainted.
	var reserved int
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		r := drv.reserved()
		if len(r) != 1 {
			return false, nil
		}
		for d, k := range r {
			reserved = d
			return k == 4, nil
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no domain was reserved for the stranded TP=4 pod: %v\n%s", err, c.ReplicaLogs())
	}
	if reserved != 1 {
		t.Fatalf("domain %d reserved, want domain 1 (one holder against two)", reserved)
	}
	other := 1 - reserved
	t.Logf("domain %d reserved for the TP=4 pod at %s", reserved, time.Since(start).Round(100*time.Millisecond))

	// 3. A TP=2 pod keeps off the reserved domain.
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, draPod("small", 2), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got := waitClaimDevices(ctx, t, c.Client, ns, "small", nil)
	for _, dev := range got {
		if d := domains[deviceKey{node, dev}]; int(d) != other {
			t.Errorf("the TP=2 pod got %v: %s is in the reserved domain %d", got, dev, reserved)
		}
	}

	// 4. The reserved domain's holder ends; the waiter gets the whole domain.
	if err := c.Client.CoreV1().Pods(ns).Delete(ctx, "holder-7", metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))}); err != nil {
		t.Fatal(err)
	}
	got = waitClaimDevices(ctx, t, c.Client, ns, "waiter", nil)
	for _, dev := range got {
		if d := domains[deviceKey{node, dev}]; int(d) != reserved {
			t.Errorf("the TP=4 pod got %v, not the reserved domain %d", got, reserved)
		}
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return len(drv.reserved()) == 0, nil
	})
	if err != nil {
		t.Errorf("the reservation outlived its placed waiter: %v (%v)", err, drv.reserved())
	}
}

// createHolder runs a pod on the node holding exactly GPU gpu, through a claim template of its
// own that selects the device by name (no nvdomain label or limit: no webhook sees it).
func createHolder(ctx context.Context, client kubernetes.Interface, ns string, gpu int) error {
	name := fmt.Sprintf("holder-%d", gpu)
	tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: names.DRARequest, Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: names.DRADeviceClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
				Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: fmt.Sprintf("device.attributes[%q].%s == %d", names.DRADriver, names.DRAAttrIndex, gpu)}}}}}}}}}}
	if _, err := client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create claim template %s: %w", name, err)
	}
	p := plainPod(name, 1)
	p.Name = name
	p.Spec.ResourceClaims[0].ResourceClaimTemplateName = ptr.To(name)
	if _, err := client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create pod %s: %w", name, err)
	}
	return nil
}

// waitClaimDevices waits until the claim of pod name is allocated and returns its devices;
// want, when set, is what they must be.
func waitClaimDevices(ctx context.Context, t *testing.T, client kubernetes.Interface, ns, name string, want []string) []string {
	t.Helper()
	var got []string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil || len(p.Status.ResourceClaimStatuses) == 0 || p.Status.ResourceClaimStatuses[0].ResourceClaimName == nil {
			return false, nil
		}
		cl, err := client.ResourceV1().ResourceClaims(ns).Get(ctx, *p.Status.ResourceClaimStatuses[0].ResourceClaimName, metav1.GetOptions{})
		if err != nil || cl.Status.Allocation == nil {
			return false, nil
		}
		got = got[:0]
		for _, r := range cl.Status.Allocation.Devices.Results {
			got = append(got, r.Device)
		}
		slices.Sort(got)
		return true, nil
	})
	if err != nil {
		t.Fatalf("pod %s/%s: its claim was never allocated: %v", ns, name, err)
	}
	if want != nil && !slices.Equal(got, want) {
		t.Fatalf("pod %s/%s got devices %v, want %v", ns, name, got, want)
	}
	return got
}

// sliceDriver stands in for the node's DRA driver, which kwok nodes cannot run: it reads the
// node's key of the reservations ConfigMap and publishes the node's slice as the driver builds
// it (dra.Resources with dra.NodeReservations), updating the slice publishDRA created.
type sliceDriver struct {
	parsed *simulated.Document
	mu     sync.Mutex
	last   map[int]int // what the slice carries now
}

func newSliceDriver(doc []byte) (*sliceDriver, error) {
	p, err := simulated.NewParser()
	if err != nil {
		return nil, err
	}
	parsed, err := p.Parse(doc)
	if err != nil {
		return nil, err
	}
	return &sliceDriver{parsed: parsed}, nil
}

func (d *sliceDriver) reserved() map[int]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.last
}

func (d *sliceDriver) follow(ctx context.Context, t *testing.T, client kubernetes.Interface, node string, stop <-chan struct{}) {
	top, err := d.parsed.ForNode(node)
	if err != nil {
		t.Error(err)
		return
	}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var published map[int]int
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		raw := ""
		cm, err := client.CoreV1().ConfigMaps(hacluster.Namespace).Get(ctx, names.DRAReservationsConfigMap, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			continue
		default:
			raw = cm.Data[node]
		}
		want, err := dra.NodeReservations(raw, time.Now())
		if err != nil {
			t.Error(err)
			return
		}
		if fmt.Sprint(want) == fmt.Sprint(published) {
			continue
		}
		res := dra.Resources(node, top, dra.Publish{Reserved: want}).Pools[node]
		name := node + "-" + names.DRADriver + "-0"
		s, err := client.ResourceV1().ResourceSlices().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			continue
		}
		s.Spec.Devices = res.Slices[0].Devices
		s.Spec.Pool.Generation++
		if _, err := client.ResourceV1().ResourceSlices().Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			continue
		}
		published = want
		d.mu.Lock()
		d.last = want
		d.mu.Unlock()
	}
}

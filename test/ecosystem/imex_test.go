package ecosystem

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/test/hacluster"
)

// What NVIDIA's compute-domain driver serves and publishes, as the stand-in below plays it.
const (
	cdDriver       = "compute-domain.nvidia.com"
	cdChannelClass = "compute-domain-default-channel.nvidia.com"
)

var cdGVR = schema.GroupVersionResource{Group: names.ComputeDomainGroup, Version: names.ComputeDomainVersion, Resource: names.ComputeDomainResource}

// TestLeaderWorkerSetGroupsGetIMEXChannels runs the real LeaderWorkerSet controller, the real
// scheduler (with its DRA allocator), the kube-controller-manager's resourceclaim controller
// and two nvdomain webhook replicas on kwok trays of two cliques, and plays NVIDIA's
// compute-domain driver with a stand-in: the ComputeDomain CRD (resource.nvidia.com/v1beta1,
// the fields nvdomain writes), a DeviceClass and per-tray ResourceSlices of IMEX channels,
// and a controller that makes each ComputeDomain's channel ResourceClaimTemplate and marks it
// Ready, as NVIDIA's controller does.
//
//  1. Without the CRD, creating a tensor-parallel LeaderWorkerSet is answered with a Warning
//     that names the missing API; its groups run, pinned to one clique, with no claim.
//  2. The CRD installed after nvdomain (the driver installed later) is noticed: a new
//     LeaderWorkerSet's pods get the ComputeDomain's channel claim, nvdomain makes the
//     ComputeDomain owned by the LeaderWorkerSet, the stand-in makes the template, the
//     scheduler allocates every pod a channel on its own tray, and every group runs in one
//     clique.
//  3. Deleting the LeaderWorkerSet deletes its ComputeDomain (garbage collection).
func TestLeaderWorkerSetGroupsGetIMEXChannels(t *testing.T) {
	lwsDir := buildTool(t, "build-lws.sh")
	c, dyn := startClusterWith(t, func(o *hacluster.Options) { o.WebhookArgs = append(o.WebhookArgs, "--imex-recheck=1s") }, "replicaset", "statefulset", "garbagecollector", "resourceclaim-controller")
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cliqueOf, base := rackCluster(ctx, t, c, lwsDir, []rack{{"rack-a.0", 4}, {"rack-b.0", 4}})

	// 1. No ComputeDomain API: a Warning at create, and the groups run without a claim.
	warned := &warnings{}
	wcfg := rest.CopyConfig(c.Config)
	wcfg.WarningHandler = warned
	wdyn := dynamic.NewForConfigOrDie(wcfg)
	first := base.DeepCopy()
	first.SetName("no-imex")
	if _, err := wdyn.Resource(lwsGVR).Namespace(ns).Create(ctx, first, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if w := warned.all(); !strings.Contains(w, "no IMEX channel") || !strings.Contains(w, "computedomains.resource.nvidia.com") {
		t.Errorf("creating a tensor-parallel LeaderWorkerSet without the ComputeDomain API warned %q", w)
	}
	pods := waitRunning(ctx, t, c, dyn, lwsNameLabel+"=no-imex", 8)
	checkGroupsInOneClique(t, pods, cliqueOf, 2, 4)
	for _, p := range pods {
		if len(p.Spec.ResourceClaims) != 0 || p.Annotations[n.PodComputeDomainAnnotation()] != "" {
			t.Errorf("pod %s got a claim without the ComputeDomain API: %+v", p.Name, p.Spec.ResourceClaims)
		}
	}
	if err := dyn.Resource(lwsGVR).Namespace(ns).Delete(ctx, "no-imex", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitGone(ctx, t, c, lwsNameLabel+"=no-imex")

	// 2. NVIDIA's driver, played by the stand-in, is installed after nvdomain.
	installComputeDomainStandIn(ctx, t, c, dyn, cliqueOf)
	warned.reset()
	if err := hacluster.Poll(ctx, 200*time.Millisecond, func() (bool, error) {
		warned.reset()
		_, err := wdyn.Resource(lwsGVR).Namespace(ns).Create(ctx, base, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil && !strings.Contains(warned.all(), "no IMEX channel"), err
	}); err != nil {
		t.Fatalf("the webhook did not notice the ComputeDomain API: %v (warnings %q)", err, warned.all())
	}
	// The dry run reached one replica. Each asks discovery on its own clock, and a group whose
	// leader pod a replica admits before it has asked gets no claim, by design: wait for all
	// of them, so that every group below has one. (The elected replica seeing marked pods
	// before it has seen the API is webhook/imex's unit test.) --imex-recheck is 1s: 30s is
	// plenty, and a replica that never notices fails here, not at the test's deadline.
	nctx, ncancel := context.WithTimeout(ctx, 30*time.Second)
	defer ncancel()
	if err := hacluster.Poll(nctx, 200*time.Millisecond, func() (bool, error) {
		return c.EveryLogContains("NVIDIA's ComputeDomain API is served"), nil
	}); err != nil {
		t.Fatalf("not every replica noticed the ComputeDomain API: %v\n%s", err, c.ReplicaLogs())
	}
	if _, err := dyn.Resource(lwsGVR).Namespace(ns).Create(ctx, base, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	selector := lwsNameLabel + "=vllm-nvl72"
	pods = waitRunning(ctx, t, c, dyn, selector, 8)
	t.Logf("groups: %v", checkGroupsInOneClique(t, pods, cliqueOf, 2, 4))
	for _, p := range pods {
		var tmpl string
		for _, rc := range p.Spec.ResourceClaims {
			if rc.Name == names.IMEXPodClaim && rc.ResourceClaimTemplateName != nil {
				tmpl = *rc.ResourceClaimTemplateName
			}
		}
		if tmpl != names.ComputeDomainChannelTemplate("vllm-nvl72") {
			t.Errorf("pod %s: IMEX claim from %q, want %q", p.Name, tmpl, names.ComputeDomainChannelTemplate("vllm-nvl72"))
		}
		// The claim the resourceclaim controller made is allocated a channel on the pod's tray.
		for _, st := range p.Status.ResourceClaimStatuses {
			if st.ResourceClaimName == nil {
				continue
			}
			claim, err := c.Client.ResourceV1().ResourceClaims(ns).Get(ctx, *st.ResourceClaimName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			a := claim.Status.Allocation
			if a == nil || len(a.Devices.Results) != 1 || a.Devices.Results[0].Pool != p.Spec.NodeName || a.Devices.Results[0].Driver != cdDriver {
				t.Errorf("pod %s on %s: claim %s allocated %+v", p.Name, p.Spec.NodeName, claim.Name, a)
			}
		}
		if len(p.Status.ResourceClaimStatuses) != 1 {
			t.Errorf("pod %s has %d claim statuses, want 1", p.Name, len(p.Status.ResourceClaimStatuses))
		}
	}
	cd, err := dyn.Resource(cdGVR).Namespace(ns).Get(ctx, names.ComputeDomainName("vllm-nvl72"), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("no ComputeDomain: %v", err)
	}
	if owners := cd.GetOwnerReferences(); len(owners) != 1 || owners[0].Kind != names.LWSKind || owners[0].Name != "vllm-nvl72" {
		t.Errorf("ComputeDomain owners %+v, want the LeaderWorkerSet", owners)
	}
	if st, _, _ := unstructured.NestedString(cd.Object, "status", "status"); st != "Ready" {
		t.Errorf("ComputeDomain status %q, want Ready (the stand-in marks it)", st)
	}

	// 3. The LeaderWorkerSet's ComputeDomain goes with it.
	if err := dyn.Resource(lwsGVR).Namespace(ns).Delete(ctx, "vllm-nvl72", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := hacluster.Poll(ctx, 250*time.Millisecond, func() (bool, error) {
		_, err := dyn.Resource(cdGVR).Namespace(ns).Get(ctx, names.ComputeDomainName("vllm-nvl72"), metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}); err != nil {
		t.Errorf("the ComputeDomain outlived its LeaderWorkerSet: %v", err)
	}
}

// warnings collects the apiserver's Warning headers.
type warnings struct {
	mu   sync.Mutex
	list []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.list = append(w.list, text)
}

func (w *warnings) all() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.list, "\n")
}

func (w *warnings) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.list = nil
}

// installComputeDomainStandIn installs what NVIDIA's compute-domain driver would: the
// ComputeDomain CRD (the spec and status fields nvdomain and the driver use), the channel
// DeviceClass, a ResourceSlice of two IMEX channels per tray, and a controller that, for each
// ComputeDomain, makes its channel ResourceClaimTemplate and marks it Ready.
func installComputeDomainStandIn(ctx context.Context, t *testing.T, c *hacluster.Cluster, dyn dynamic.Interface, trays map[string]string) {
	t.Helper()
	preserve := &apiextensionsv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: ptr.To(true)}
	crd := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: names.ComputeDomainResource + "." + names.ComputeDomainGroup},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: names.ComputeDomainGroup, Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: names.ComputeDomainResource, Singular: "computedomain", Kind: names.ComputeDomainKind, ListKind: names.ComputeDomainKind + "List"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: names.ComputeDomainVersion, Served: true, Storage: true,
				Subresources: &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}},
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
					"spec": {Type: "object", Required: []string{"channel"}, Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"numNodes": {Type: "integer", Minimum: ptr.To(0.0)},
						"channel": {Type: "object", Required: []string{"resourceClaimTemplate"}, Properties: map[string]apiextensionsv1.JSONSchemaProps{
							"resourceClaimTemplate": {Type: "object", Required: []string{"name"}, Properties: map[string]apiextensionsv1.JSONSchemaProps{"name": {Type: "string"}}},
							"allocationMode":        {Type: "string", Enum: []apiextensionsv1.JSON{{Raw: []byte(`"Single"`)}, {Raw: []byte(`"All"`)}}},
						}},
					}},
					"status": *preserve,
				}}},
			}},
		},
	}
	if _, err := envtest.InstallCRDs(c.Config, envtest.CRDInstallOptions{CRDs: []*apiextensionsv1.CustomResourceDefinition{crd}}); err != nil {
		t.Fatal(err)
	}
	dc := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: cdChannelClass}, Spec: resourceapi.DeviceClassSpec{
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == %q", cdDriver)}}},
	}}
	if _, err := c.Client.ResourceV1().DeviceClasses().Create(ctx, dc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for tray := range trays {
		slice := &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: tray + "-" + cdDriver},
			Spec: resourceapi.ResourceSliceSpec{Driver: cdDriver, NodeName: ptr.To(tray),
				Pool: resourceapi.ResourcePool{Name: tray, Generation: 1, ResourceSliceCount: 1},
				// One channel per node, as NVIDIA's driver publishes it.
				Devices: []resourceapi.Device{{Name: "channel-0"}}},
		}
		if _, err := c.Client.ResourceV1().ResourceSlices().Create(ctx, slice, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The stand-in controller: a poll is enough for a test.
	go func() {
		for ctx.Err() == nil {
			l, err := dyn.Resource(cdGVR).Namespace(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
			if err == nil {
				for i := range l.Items {
					readyComputeDomain(ctx, t, c, dyn, &l.Items[i])
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
}

// readyComputeDomain makes cd's channel template, if missing, and marks cd Ready.
func readyComputeDomain(ctx context.Context, t *testing.T, c *hacluster.Cluster, dyn dynamic.Interface, cd *unstructured.Unstructured) {
	name, _, _ := unstructured.NestedString(cd.Object, "spec", "channel", "resourceClaimTemplate", "name")
	rct := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: cd.GetNamespace(),
			OwnerReferences: []metav1.OwnerReference{{APIVersion: cdGVR.GroupVersion().String(), Kind: names.ComputeDomainKind, Name: cd.GetName(), UID: cd.GetUID()}}},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "channel", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: cdChannelClass}}},
		}}},
	}
	if _, err := c.Client.ResourceV1().ResourceClaimTemplates(cd.GetNamespace()).Create(ctx, rct, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Logf("stand-in: template %s: %v", name, err)
		return
	}
	if st, _, _ := unstructured.NestedString(cd.Object, "status", "status"); st == "Ready" {
		return
	}
	_ = unstructured.SetNestedField(cd.Object, "Ready", "status", "status")
	if _, err := dyn.Resource(cdGVR).Namespace(cd.GetNamespace()).UpdateStatus(ctx, cd, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) {
		t.Logf("stand-in: status of %s: %v", cd.GetName(), err)
	}
}

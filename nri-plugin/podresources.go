package nriplugin

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/containerd/nri/pkg/api"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/nvdomain/nvdomain/pkg/names"
)

// Allocations answers which NVIDIA devices the kubelet allocated to a container: the
// kubelet's PodResources API, whose answer comes from the device manager, never from the
// pod's spec. Under the envvar strategy a GPU list in NVIDIA_VISIBLE_DEVICES is the device
// plugin's form, and so is a list a pod's envFrom (a ConfigMap no admission policy can read,
// and which may change after admission) or an image's ENV put there; only the kubelet can
// tell which one the device plugin wrote.
type Allocations interface {
	// Allocated returns the ids of the nvidia.com/ devices allocated to the container.
	Allocated(ctx context.Context, namespace, pod, container string) ([]string, error)
	// AllocatedGPUs returns the ids of the devices of GPU resources
	// (names.IsGPUDevicePluginResource) a device plugin allocated to the container: not a
	// NIC's or an IMEX channel's, which share the nvidia.com/ prefix.
	AllocatedGPUs(ctx context.Context, namespace, pod, container string) ([]string, error)
}

// podResources asks the kubelet over its PodResources socket.
type podResources struct {
	client  podresourcesv1.PodResourcesListerClient
	timeout time.Duration
}

// DialPodResources connects to the kubelet's PodResources socket (the kubelet's
// /var/lib/kubelet/pod-resources/kubelet.sock). The connection is made lazily, so a kubelet
// that is not up yet is asked again at the next creation.
func DialPodResources(socket string) (Allocations, func() error, error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, fmt.Errorf("kubelet PodResources socket %s: %w", socket, err)
	}
	return &podResources{client: podresourcesv1.NewPodResourcesListerClient(conn), timeout: time.Second}, conn.Close, nil
}

// Allocated asks Get (GA in Kubernetes 1.36, beta and on since 1.34), else List. An older
// kubelet answers Get with Unimplemented (before 1.27), or, with the KubeletPodResourcesGet
// gate off (1.27 to 1.33), with a plain error that has no code of its own ("PodResources API
// Get method disabled"), so any error but the deadline falls back to List rather than
// refusing every envvar GPU container on those kubelets (review node-side M5).
func (r *podResources) Allocated(ctx context.Context, namespace, pod, container string) ([]string, error) {
	return r.allocated(ctx, namespace, pod, container, func(res string) bool { return strings.HasPrefix(res, names.NVIDIAPrefix) })
}

// AllocatedGPUs is Allocated for GPU resources only.
func (r *podResources) AllocatedGPUs(ctx context.Context, namespace, pod, container string) ([]string, error) {
	return r.allocated(ctx, namespace, pod, container, names.IsGPUDevicePluginResource)
}

func (r *podResources) allocated(ctx context.Context, namespace, pod, container string, want func(resource string) bool) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	resp, err := r.client.Get(ctx, &podresourcesv1.GetPodResourcesRequest{PodName: pod, PodNamespace: namespace})
	switch {
	case err == nil:
		return devicesOf(resp.GetPodResources(), container, want), nil
	case ctx.Err() != nil || status.Code(err) == codes.DeadlineExceeded || status.Code(err) == codes.ResourceExhausted:
		// The kubelet rate-limits PodResources (ResourceExhausted): asking List would only
		// spend another token. The container is refused and the kubelet retries it.
		return nil, fmt.Errorf("kubelet PodResources Get %s/%s: %w", namespace, pod, err)
	}
	list, lerr := r.client.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if lerr != nil {
		return nil, fmt.Errorf("kubelet PodResources List (after Get %s/%s failed: %v): %w", namespace, pod, err, lerr)
	}
	for _, p := range list.GetPodResources() {
		if p.GetNamespace() == namespace && p.GetName() == pod {
			return devicesOf(p, container, want), nil
		}
	}
	return nil, nil
}

func devicesOf(p *podresourcesv1.PodResources, container string, want func(resource string) bool) []string {
	var ids []string
	for _, c := range p.GetContainers() {
		if c.GetName() != container {
			continue
		}
		for _, d := range c.GetDevices() {
			if want(d.GetResourceName()) {
				ids = append(ids, d.GetDeviceIds()...)
			}
		}
	}
	return ids
}

// allocatedIfAmbiguous asks the kubelet what it allocated to the container when only the
// kubelet can tell whether a GPU list in NVIDIA_VISIBLE_DEVICES is the device plugin's: the
// envvar strategy is on, the variable lists devices, and no CDI name or volume mount brought
// GPUs. Nil when it need not ask (or no Allocations is configured). A kubelet that does not
// answer refuses the container: the list might not be the device plugin's.
func (p *Plugin) allocatedIfAmbiguous(ctx context.Context, pod *api.PodSandbox, ctr *api.Container) (*[]string, error) {
	if p.cfg.Allocations == nil || !p.uses(names.StrategyEnvVar) {
		return nil, nil
	}
	v, _, ok := envValue(ctr.Env, names.VisibleDevicesEnv)
	switch v = strings.TrimSpace(v); {
	case !ok, v == "", v == names.VisibleDevicesNone, v == names.VisibleDevicesVoid, v == names.VisibleDevicesAll, v == names.VolumeMountsDir:
		return nil, nil
	}
	ids, err := p.cfg.Allocations.Allocated(ctx, pod.Namespace, pod.Name, ctr.Name)
	if err != nil {
		return nil, fmt.Errorf("%s lists GPUs under the envvar strategy, and only the kubelet's PodResources API can tell whether the device plugin wrote it (a pod's envFrom or image can too); it did not answer, so the container is refused until it does: %w; "+
			"check the nvdomain-nri container's --pod-resources-socket and its mount of /var/lib/kubelet/pod-resources", names.VisibleDevicesEnv, err)
	}
	return &ids, nil
}

// unlistEnv takes back the GPUs readGiven counted from NVIDIA_VISIBLE_DEVICES alone and marks
// the variable for neutralising: the kubelet allocated the container no GPU.
func (p *Plugin) unlistEnv(g Given) Given {
	if len(g.CDINames) > 0 || len(g.Mounts) > 0 {
		return g // other forms brought GPUs: the variable is not the only witness
	}
	g.EnvList, g.NeutraliseEnv, g.GPUs, g.StrategyMismatch = false, g.Env, nil, false
	g.named, g.Untouchable, g.mig = map[int]bool{}, "", false
	return g
}

// envWithinAllocation checks that every device NVIDIA_VISIBLE_DEVICES lists (its last copy,
// the one the toolkit reads) is one the kubelet allocated the container, when the variable is
// the only witness of its GPUs (envvar strategy, no CDI name or mount). The kubelet's ids are
// the device plugin's (a UUID or an index, as DEVICE_ID_STRATEGY says, the same form it writes
// into the variable); a time-sliced replica's id carries a ::<n> suffix the variable does not.
// A list shorter than the allocation is let through: it gives the container fewer GPUs than
// it was counted for, which takes nothing from anyone; extra allocated ids that never appear
// in the variable (an IMEX channel, another nvidia.com/ resource) are fine for the same reason.
func envWithinAllocation(g Given, allocated []string) error {
	if len(g.CDINames) > 0 || len(g.Mounts) > 0 {
		return nil // other forms brought GPUs: the device plugin wrote those, not the pod
	}
	ok := map[string]bool{}
	for _, id := range allocated {
		id, _, _ = strings.Cut(strings.TrimSpace(id), "::")
		ok[id] = true
	}
	var extra []string
	for _, id := range strings.Split(g.Env, ",") {
		if id = strings.TrimSpace(id); id != "" && !ok[id] {
			extra = append(extra, id)
		}
	}
	if len(extra) == 0 {
		return nil
	}
	return fmt.Errorf("%s=%s names %s, which the kubelet did not allocate to this container (its PodResources answer: %s): under the envvar strategy the variable is the grant, so a list written by the pod's env or envFrom, or by its image, would take GPUs nobody counted; "+
		"remove %s from the pod's env and envFrom (GPUs come only from a %s request, and the device plugin writes the variable)",
		names.VisibleDevicesEnv, g.Env, strings.Join(extra, ","), strings.Join(allocated, ","), names.VisibleDevicesEnv, names.GPUResource)
}

// Package names declares every label, annotation and resource name that nvdomain reads or
// writes, and the helpers that build and parse them. Nothing else in the module spells these
// strings: a reader who asks "where is this label written?" follows the helper from here.
//
// Two prefixes are configurable (--label-prefix and --resource-prefix, bound once by
// BindFlags; the chart sets them in charts/nvdomain/values.yaml): the label prefix, used for
// the node labels and the gpu.nvidia.com/ annotations, and the resource prefix, used for the
// per-domain extended resources and the per-domain GPU-list annotations. The names that belong
// to other projects (the GPU device plugin's nvidia.com/gpu, the nvidia.com/ labels of GPU
// Operator and GPU feature discovery) are fixed.
package names

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
)

// Names that nvdomain does not own and therefore never makes configurable.
const (
	// TPLabel opts a pod into tensor-parallel placement when its value is TPLabelValue.
	TPLabel = "tensor-parallel"
	// TPLabelValue is the only value of TPLabel that opts in.
	TPLabelValue = "true"
	// KueueGroup is the API group of Kueue's objects (Workload, ClusterQueue);
	// KueueWorkloadVersion the version of them nvdomain reads, and KueueQuotaReserved the
	// Workload condition that says whether a ClusterQueue reserved quota for it.
	KueueGroup           = "kueue.x-k8s.io"
	KueueWorkloadVersion = "v1beta2"
	KueueQuotaReserved   = "QuotaReserved"
	// KueueQueueLabel names the LocalQueue a workload is submitted to.
	KueueQueueLabel = "kueue.x-k8s.io/queue-name"
	// HelmReleaseNameAnnotation and HelmReleaseNamespaceAnnotation are what Helm (the CLI, the
	// SDK, Flux's helm-controller) puts on every object it installs; `helm template` output
	// does not carry them.
	HelmReleaseNameAnnotation      = "meta.helm.sh/release-name"
	HelmReleaseNamespaceAnnotation = "meta.helm.sh/release-namespace"
	// ArgoCDTrackingAnnotation is what Argo CD (annotation tracking, its default since v3.0)
	// puts on every object of an Application, hooks included:
	// "<app>:<group>/<kind>:<namespace>/<name>", <app> being "<namespace>_<name>" for an
	// Application outside Argo CD's own namespace.
	ArgoCDTrackingAnnotation = "argocd.argoproj.io/tracking-id"
	// LWSNameLabel and LWSGroupIndexLabel are the labels LeaderWorkerSet's pod webhook puts
	// on every pod of a group: the LeaderWorkerSet and the group's index.
	LWSNameLabel       = "leaderworkerset.sigs.k8s.io/name"
	LWSGroupIndexLabel = "leaderworkerset.sigs.k8s.io/group-index"
	// LWSWorkerIndexLabel is the pod's place in its group ("0": the leader), LWSSizeAnnotation
	// the group's pod count, and LWSLeaderNameAnnotation, on workers, the leader's pod name
	// (LeaderWorkerSet v0.8).
	LWSWorkerIndexLabel     = "leaderworkerset.sigs.k8s.io/worker-index"
	LWSSizeAnnotation       = "leaderworkerset.sigs.k8s.io/size"
	LWSLeaderNameAnnotation = "leaderworkerset.sigs.k8s.io/leader-name"
	// GPUResource is the NVIDIA device plugin's whole-GPU resource.
	GPUResource = "nvidia.com/gpu"
	// SharedGPUResource is what the device plugin advertises for time-sliced GPUs when
	// renameByDefault is set.
	SharedGPUResource = GPUResource + SharedResourceSuffix
	// MIGResourcePrefix starts every MIG profile resource (mixed strategy), e.g.
	// nvidia.com/mig-1g.5gb.
	MIGResourcePrefix = "nvidia.com/mig-"
	// NVIDIAPrefix is the vendor prefix of every GPU resource the NVIDIA stack advertises.
	NVIDIAPrefix = "nvidia.com/"
	// WorkloadConfigLabel is GPU Operator's per-node workload mode label.
	WorkloadConfigLabel = "nvidia.com/gpu.workload.config"
	// GPUCliqueLabel is NVIDIA GPU Feature Discovery's node label for the multi-node NVLink
	// clique a node's GPUs are in (GB200/GB300 NVL72), <cluster UUID>.<clique id>. nvdomain's
	// agent writes the same value where GFD does not run (topology.Fabric.Label), and never
	// overwrites a value another writer set (agent.Publisher).
	GPUCliqueLabel = "nvidia.com/gpu.clique"

	// ComputeDomainGroup and ComputeDomainResource are NVIDIA's DRA driver's ComputeDomain
	// API: a ComputeDomain gives a multi-node NVLink workload its IMEX channel through a
	// ResourceClaimTemplate its pods claim.
	ComputeDomainGroup    = "resource.nvidia.com"
	ComputeDomainResource = "computedomains"
	// ComputeDomainVersion and ComputeDomainKind are the version and kind nvdomain writes
	// (NVIDIA's k8s-dra-driver-gpu v25.x serves resource.nvidia.com/v1beta1).
	ComputeDomainVersion = "v1beta1"
	ComputeDomainKind    = "ComputeDomain"
	// IMEXPodClaim is the spec.resourceClaims entry nvdomain gives a group's pods for their
	// IMEX channel, from the ResourceClaimTemplate of the LeaderWorkerSet's ComputeDomain
	// (ComputeDomainChannelTemplate); each GPU container claims it.
	IMEXPodClaim = "nvdomain-imex"

	// LWSRevisionLabel is the template revision LeaderWorkerSet puts on a group's pods: a
	// rolling update makes new groups with a new one.
	LWSRevisionLabel = "leaderworkerset.sigs.k8s.io/template-revision-hash"
	// LWSExclusiveTopologyAnnotation, copied by LWS onto the leader pod, makes LWS create the
	// workers only once the leader is scheduled; LWSStartupLeaderReady, the LeaderWorkerSet's
	// spec.startupPolicy, only once it is Ready. A gang of the whole group would wait for
	// those workers for ever, so such groups are pinned instead.
	LWSExclusiveTopologyAnnotation = "leaderworkerset.sigs.k8s.io/exclusive-topology"
	LWSStartupLeaderReady          = "LeaderReady"

	// PodGroupGroup, PodGroupVersion, PodGroupResource and PodGroupKind name the Workload
	// API's PodGroup (KEP-4671 gang scheduling, KEP-5732 topology constraints) at the version
	// nvdomain writes: Kubernetes 1.37's scheduling.k8s.io/v1beta1.
	PodGroupGroup    = "scheduling.k8s.io"
	PodGroupVersion  = "v1beta1"
	PodGroupResource = "podgroups"
	PodGroupKind     = "PodGroup"

	// LWSGroup, LWSVersion, LWSKind and LWSResource name LeaderWorkerSet's API.
	LWSGroup    = "leaderworkerset.x-k8s.io"
	LWSVersion  = "v1"
	LWSKind     = "LeaderWorkerSet"
	LWSResource = "leaderworkersets"

	// ToolkitDeployLabel is set to "true" by the GPU Operator on nodes where it runs its
	// container toolkit, which restarts containerd after writing its config.
	ToolkitDeployLabel = "nvidia.com/gpu.deploy.container-toolkit"
	// ToolkitReadyDir and ToolkitReadyFile: the GPU Operator's validator writes the file once
	// the toolkit is installed, after the toolkit's containerd restart.
	ToolkitReadyDir  = "/run/nvidia/validations"
	ToolkitReadyFile = "toolkit-ready"
)

// Values of WorkloadConfigLabel.
const (
	WorkloadContainer     = "container"
	WorkloadVMPassthrough = "vm-passthrough"
	WorkloadVMVGPU        = "vm-vgpu"
)

// GPU Operator's MIG names: the node label that picks a mig-parted config, the label where
// mig-manager reports how applying it went, and where the configs live.
const (
	// MIGConfigLabel names the mig-parted config a node should run, e.g. all-1g.5gb.
	MIGConfigLabel = "nvidia.com/mig.config"
	// MIGConfigStateLabel is mig-manager's report on applying MIGConfigLabel.
	MIGConfigStateLabel = "nvidia.com/mig.config.state"
	// DefaultMIGPartedConfigMap is the ConfigMap GPU Operator installs with its configs.
	DefaultMIGPartedConfigMap = "default-mig-parted-config"
	// MIGPartedConfigKey is the ConfigMap key holding the mig-parted config file.
	MIGPartedConfigKey = "config.yaml"
)

// Values of MIGConfigStateLabel.
const (
	MIGStateSuccess   = "success"
	MIGStatePending   = "pending"
	MIGStateRebooting = "rebooting"
	MIGStateFailed    = "failed"
)

// Labels GPU feature discovery (GFD) writes, which say how the device plugin exposes a node's
// GPUs.
const (
	// MIGStrategyLabel is the device plugin's MIG strategy: single, mixed or none.
	MIGStrategyLabel = "nvidia.com/mig.strategy"
	// GPUCountLabel is the number of GPUs; under the single MIG strategy GFD overrides it with
	// the number of MIG devices.
	GPUCountLabel = "nvidia.com/gpu.count"
	// GPUProductLabel is the GPU model, e.g. NVIDIA-A100-SXM4-40GB. GFD appends
	// MIGProductInfix and the profile under the single MIG strategy, and SharedProductSuffix
	// when time-sliced GPUs are renamed.
	GPUProductLabel = "nvidia.com/gpu.product"
	// GPUReplicasLabel is the number of time-slicing replicas of each GPU.
	GPUReplicasLabel = "nvidia.com/gpu.replicas"
	// MIGProductInfix separates the model from the MIG profile in GPUProductLabel, as in
	// A100-SXM4-40GB-MIG-1g.5gb.
	MIGProductInfix = "-MIG-"
	// SharedProductSuffix ends GPUProductLabel when time-sliced GPUs are renamed.
	SharedProductSuffix = "-SHARED"
	// SharedResourceSuffix ends a resource name the device plugin renamed for time-slicing
	// (nvidia.com/gpu.shared, nvidia.com/mig-1g.5gb.shared).
	SharedResourceSuffix = ".shared"
)

// Values of MIGStrategyLabel.
const (
	MIGStrategySingle = "single"
	MIGStrategyMixed  = "mixed"
	MIGStrategyNone   = "none"
)

// MIGResource is the mixed-strategy resource for a mig-parted profile: nvidia.com/mig-1g.5gb
// for "1g.5gb". Resource names cannot hold '+', so the device plugin writes a profile's
// attributes after a dot ("1g.5gb+me" is nvidia.com/mig-1g.5gb.me).
func MIGResource(profile string) string {
	return MIGResourcePrefix + strings.ReplaceAll(profile, "+", ".")
}

// How NVIDIA's device plugin hands GPUs to a container, by its DEVICE_LIST_STRATEGY, and the
// names each strategy uses. The NRI plugin reads them to know which GPUs a container was
// given and rewrites them; the simulated device plugin writes them.
const (
	// VisibleDevicesEnv is the variable the NVIDIA container toolkit reads (envvar strategy);
	// CDI specs set it to VisibleDevicesVoid so the toolkit adds nothing of its own.
	// VisibleDevicesNone gives no GPU (but the driver's libraries); VisibleDevicesAll every
	// GPU of the node, which NVIDIA's device plugin never writes (it lists ids), and which
	// CUDA base images set in their own environment.
	VisibleDevicesEnv  = "NVIDIA_VISIBLE_DEVICES"
	VisibleDevicesVoid = "void"
	VisibleDevicesNone = "none"
	VisibleDevicesAll  = "all"
	// VolumeMountsDir is where the volume-mounts strategy bind-mounts one /dev/null per GPU,
	// named by the GPU's id; NVIDIA_VISIBLE_DEVICES then names this directory.
	VolumeMountsDir = "/var/run/nvidia-container-devices"
	// DevicePluginCDIVendor and the classes below make the CDI device names the device plugin
	// returns under the cdi-cri and cdi-annotations strategies:
	// k8s.device-plugin.nvidia.com/gpu=<uuid>, k8s.device-plugin.nvidia.com/mig=<uuid>.
	DevicePluginCDIVendor = "k8s.device-plugin.nvidia.com"
	CDIClassGPU           = "gpu"
	CDIClassMIG           = "mig"
	// CDIClassIMEXChannel is the class of IMEX channels in NVIDIA's CDI specs
	// (nvidia.com/imex-channel=<n>, which the device plugin adds beside GPUs on GB200-class
	// nodes): a channel of the node's IMEX domain for multi-node NVLink memory, no GPU.
	CDIClassIMEXChannel = "imex-channel"
	// MIGCapsDir holds the MIG capability nodes (nvidia-cap<N>) a MIG device brings; the
	// IMEX channels' directory shares its prefix but not the directory (IMEXChannelsDir).
	MIGCapsDir = "/dev/nvidia-caps/"
	// IMEXChannelsDir holds the IMEX channel nodes (channel<N>); they reach no GPU.
	IMEXChannelsDir = "/dev/nvidia-caps-imex-channels/"
	// NVIDIACDIVendor is the vendor of the CDI spec the NVIDIA Container Toolkit generates
	// (nvidia-ctk cdi generate) and NVIDIA's DRA driver uses: nvidia.com/gpu=<uuid|index>, and
	// MIG devices as nvidia.com/gpu=<gpu>:<mig> or by their MIG- UUID.
	NVIDIACDIVendor = "nvidia.com"
	// CDIAnnotationPrefix starts the annotations that carry CDI device names
	// (cdi-annotations strategy); the device plugin's key is
	// cdi.k8s.io/nvidia-device-plugin_<id>. The kubelet puts a device plugin's annotations on
	// the CRI container config (not on the pod), containerd applies the CDI devices they name,
	// and NRI plugins see them among the container's annotations.
	CDIAnnotationPrefix = "cdi.k8s.io/"
	// ToolkitCDIAnnotationPrefix starts the pod annotations the NVIDIA container toolkit's
	// own NRI plugin reads (nvidia.cdi.k8s.io/container.<name>: CDI devices to inject).
	ToolkitCDIAnnotationPrefix = "nvidia." + CDIAnnotationPrefix
	// DevicePluginCDIAnnotationKey is the device plugin's annotation key before its id.
	DevicePluginCDIAnnotationKey = CDIAnnotationPrefix + "nvidia-device-plugin_"
	// GPUDeviceMajor is the NVIDIA driver's character-device major: /dev/nvidia<minor>.
	GPUDeviceMajor = 195
	// DRMDeviceMajor is the DRM subsystem's character-device major: /dev/dri/card<N> and
	// renderD<N>, which NVIDIA's CDI specs give each GPU.
	DRMDeviceMajor = 226
	// GPUDevicePrefix starts a GPU's device node path; the minor number follows.
	GPUDevicePrefix = "/dev/nvidia"
)

// Device list strategies, as NVIDIA's device plugin spells them.
const (
	StrategyEnvVar         = "envvar"
	StrategyVolumeMounts   = "volume-mounts"
	StrategyCDIAnnotations = "cdi-annotations"
	StrategyCDICRI         = "cdi-cri"
)

// DefaultDeviceListStrategies are the GPU Operator's (v25.10 and later). The simulated device
// plugin and the NRI plugin share this default, so both read the same strategies unless told
// otherwise.
var DefaultDeviceListStrategies = []string{StrategyCDIAnnotations, StrategyCDICRI}

// ParseDeviceListStrategies reads a --device-list-strategy value: a comma-separated list of
// the Strategy* names.
func ParseDeviceListStrategies(s string) ([]string, error) {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out, ValidateDeviceListStrategies(out)
}

// ValidateDeviceListStrategies checks a list of device list strategies.
func ValidateDeviceListStrategies(ss []string) error {
	if len(ss) == 0 {
		return fmt.Errorf("--device-list-strategy: give at least one of %s, %s, %s, %s", StrategyEnvVar, StrategyVolumeMounts, StrategyCDIAnnotations, StrategyCDICRI)
	}
	for _, s := range ss {
		switch s {
		case StrategyEnvVar, StrategyVolumeMounts, StrategyCDIAnnotations, StrategyCDICRI:
		default:
			return fmt.Errorf("--device-list-strategy: %q is not one of %s, %s, %s, %s", s, StrategyEnvVar, StrategyVolumeMounts, StrategyCDIAnnotations, StrategyCDICRI)
		}
	}
	return nil
}

// DefaultTrustedNamespaces are where the NRI plugin leaves containers exactly as they are:
// kube-system, and the namespaces the NVIDIA GPU Operator installs into (its dcgm-exporter and
// validators set NVIDIA_VISIBLE_DEVICES=all on purpose). The chart adds its own namespace.
var DefaultTrustedNamespaces = []string{"kube-system", "gpu-operator", "nvidia-gpu-operator"}

// Node condition types the node agent sets on its Node, so `kubectl describe node`, the
// CLI's status and alerts see the node side's health where operators look first.
const (
	// ConditionTopology is True while the agent publishes a topology its source yields, and
	// False (with the source's error and the fix) while there is none, e.g. NVML cannot be
	// loaded.
	ConditionTopology = "NvdomainTopology"
	// ConditionFailClosed is True once the node proved that containerd's NRI validator refuses
	// a container requiring a plugin that is not there (the canary), False when a canary ran,
	// and Unknown until then.
	ConditionFailClosed = "NvdomainFailClosed"
	// ReasonRuntimeWithoutValidator is ConditionFailClosed's reason on a node whose runtime
	// cannot validate NRI adjustments (containerd before 2.2), as the NRI plugin reported it.
	ReasonRuntimeWithoutValidator = "RuntimeWithoutValidator"
	// ConditionFailClosed's reasons for a canary that ran and proved nothing (Unknown: the pod
	// not created, rejected by the kubelet, or its container neither refused nor started) and
	// for one whose image the kubelet could not pull (False).
	ReasonCanaryNotCreated     = "CanaryNotCreated"
	ReasonCanaryRejected       = "CanaryRejected"
	ReasonCanaryUndecided      = "CanaryUndecided"
	ReasonCanaryImageNotPulled = "CanaryImageNotPulled"
	// ConditionDRADevices is True while the DRA driver publishes the node's GPUs, and False
	// while it withdraws them (ReasonDevicePluginOnDRANode: a device plugin advertises
	// nvidia.com/gpu on the node, and the two would hand out the same GPUs).
	ConditionDRADevices         = "NvdomainDRADevices"
	ReasonDevicePluginOnDRANode = "DevicePluginOnDRANode"
	ReasonDRADevicesPublished   = "Published"
)

// NRI's default validator refuses a container that a plugin its pod requires did not see.
const (
	// NRIPluginName is the name nvdomain's NRI plugin registers under (without its index).
	NRIPluginName = "nvdomain"
	// RequiredPluginsAnnotation is the validator's pod annotation key; a per-container key adds
	// RequiredPluginsContainerInfix and the container's name.
	RequiredPluginsAnnotation     = "required-plugins.noderesource.dev"
	RequiredPluginsContainerInfix = "/container."
	// RequiredPluginsPod is the pod-scoped key: it applies to every container that has no
	// container-scoped key of its own (NRI's GetEffectiveAnnotation).
	RequiredPluginsPod = RequiredPluginsAnnotation + "/pod"
)

// maxAnnotationNamePart is the apiserver's limit on the part of an annotation key after the
// prefix's slash (a qualified name).
const maxAnnotationNamePart = 63

// RequiredPluginsFor is the pod annotation that makes containerd refuse the named container
// unless nvdomain's NRI plugin handles its creation. A container name longer than 53
// characters cannot fit the container-scoped key (the apiserver would reject the pod), so
// such a container gets the pod-scoped key, which also applies to the pod's other containers
// that have no key of their own: they then need the plugin too, which costs nothing while it
// runs.
func RequiredPluginsFor(container string) string {
	key := RequiredPluginsAnnotation + RequiredPluginsContainerInfix + container
	if len(key)-len(RequiredPluginsAnnotation)-1 > maxAnnotationNamePart {
		return RequiredPluginsPod
	}
	return key
}

// Default prefixes, the ones charts/nvdomain/values.yaml ships.
const (
	DefaultLabelPrefix    = "gpu.nvidia.com"
	DefaultResourcePrefix = "nvidia.com"
)

// Topology sources, the values of the topology-source label.
const (
	SourceNVML       = "nvml"
	SourceTopoMatrix = "topo-matrix"
	SourceSimulated  = "simulated"
)

// Names holds the configured prefixes and builds every nvdomain-owned name from them. The zero
// value is not usable; call Default or New.
type Names struct {
	labelPrefix    string
	resourcePrefix string
}

// Default returns the names with the documented default prefixes.
func Default() Names {
	return Names{labelPrefix: DefaultLabelPrefix, resourcePrefix: DefaultResourcePrefix}
}

// New returns names built from the given prefixes. Each prefix must be a DNS subdomain, since
// Kubernetes requires one before the slash of a qualified name.
func New(labelPrefix, resourcePrefix string) (Names, error) {
	for _, p := range []struct{ field, value string }{
		{"labelPrefix", labelPrefix},
		{"resourcePrefix", resourcePrefix},
	} {
		if err := validateDNSSubdomain(p.value); err != nil {
			return Names{}, fmt.Errorf("%s %q: %w", p.field, p.value, err)
		}
	}
	return Names{labelPrefix: labelPrefix, resourcePrefix: resourcePrefix}, nil
}

// LabelPrefix returns the configured label prefix, without the slash.
func (n Names) LabelPrefix() string { return n.labelPrefix }

// ResourcePrefix returns the configured resource prefix, without the slash.
func (n Names) ResourcePrefix() string { return n.resourcePrefix }

func (n Names) label(suffix string) string    { return n.labelPrefix + "/" + suffix }
func (n Names) resource(suffix string) string { return n.resourcePrefix + "/" + suffix }

const (
	domainSuffix           = "nvswitch-domain-"
	domainGPUsSuffix       = "gpu-topo-nvswitch-domain-"
	domainCountSuffix      = "nvswitch-domains"
	domainMaxSuffix        = "nvswitch-domain-max"
	topologySrcSuffix      = "topology-source"
	topologyStale          = "topology-stale"
	uninstallSuffix        = "uninstall"
	failOpen               = "nri-fail-open"
	pluginDisconnected     = "nri-disconnected"
	failClosedProven       = "fail-closed-proven"
	uninstallDrained       = "uninstall-drained"
	topologyMismatch       = "topology-mismatch"
	topologySuffix         = "topology"
	podDomainSuffix        = "nvswitch-domain"
	podTPSizeSuffix        = "tp-size"
	podContainerSuffix     = "container-gpus"
	podAssignedSuffix      = "assigned-gpus"
	podAdmissionSuffix     = "admission-id"
	nriHandledSuffix       = "nri-handled"
	cliqueGPUsSuffix       = "nvlink-clique-gpus"
	cliqueNodesSuffix      = "nvlink-clique-nodes"
	cliqueByAgent          = "nvlink-clique-published"
	podCliqueSuffix        = "nvlink-clique"
	podComputeDomainSuffix = "compute-domain"
	podGroupSuffix         = "pod-group"
)

// Node labels.

// DomainCountLabel is the node label holding the number of NVLink domains.
func (n Names) DomainCountLabel() string { return n.label(domainCountSuffix) }

// DomainSizeLabel is the node label holding the size of domain id. Its value is an integer so
// that a nodeAffinity Gt expression can test it.
func (n Names) DomainSizeLabel(id int) string { return n.label(domainSuffix + strconv.Itoa(id)) }

// DomainMaxLabel is the node label holding the size of the node's largest domain.
func (n Names) DomainMaxLabel() string { return n.label(domainMaxSuffix) }

// TopologySourceLabel is the node label naming where the topology came from.
func (n Names) TopologySourceLabel() string { return n.label(topologySrcSuffix) }

// TopologyStaleLabel is "true" while the agent's source is broken and the published topology
// is the last good one.
func (n Names) TopologyStaleLabel() string { return n.label(topologyStale) }

// FailOpenLabel is "true" on a node whose fail-closed canary was let through: containerd's
// NRI validator is not active there, so a GPU container would start without the NRI plugin
// placing it. With node.requireFailClosed (the default) its domain capacity is then 0, and
// no tensor-parallel pod is placed there until the canary is refused again.
func (n Names) FailOpenLabel() string { return n.label(failOpen) }

// PluginDisconnectedLabel is "true" on a node whose NRI plugin has lost the container runtime
// and not synchronized again: containerd refuses every container that requires the plugin
// meanwhile. The webhook counts no room there (the node is unavailable, as a cordoned one), so
// no pod that fits now elsewhere is pinned toward it and a refused pod is not moved back to it;
// a pod that has to wait anyway waits for its room while the label is a minute old at most, as
// a webhook replica sees it (a node pod restart, clusterview.ReconnectingFor; a node also
// NotReady counts as a NotReady one). The published capacity
// is left alone: a capacity below what bound pods request would make the kubelet reject them
// at its next restart (review classic M7).
func (n Names) PluginDisconnectedLabel() string { return n.label(pluginDisconnected) }

// UninstallAnnotation, on a node DaemonSet, says its release is being uninstalled: the
// chart's pre-delete hook sets it (docs/operations.md, Uninstall). The node pods then take
// their node's state down and serve the NRI plugin in pass-through until no pod on the node
// requires it.
func (n Names) UninstallAnnotation() string { return n.label(uninstallSuffix) }

// UninstallDrainedAnnotation, on a node pod, says no pod on its node requires the NRI plugin
// any more; once every node pod says so, the last of them deletes the kept DaemonSets.
func (n Names) UninstallDrainedAnnotation() string { return n.label(uninstallDrained) }

// TopologyMismatchLabel is "true" while the NRI plugin on the node serves another topology
// than the agent publishes, so domain ids in pod annotations may mean other GPUs there.
func (n Names) TopologyMismatchLabel() string { return n.label(topologyMismatch) }

// CliqueGPUsLabel and CliqueNodesLabel hold the size of the node's multi-node NVLink clique
// (GPUCliqueLabel) in GPUs and in nodes (compute trays), where the agent knows it: a simulated
// rack declares it; NVML reports membership only, and the webhook then counts the clique's
// nodes from their GPUCliqueLabel.
func (n Names) CliqueGPUsLabel() string  { return n.label(cliqueGPUsSuffix) }
func (n Names) CliqueNodesLabel() string { return n.label(cliqueNodesSuffix) }

// CliquePublishedAnnotation holds the GPUCliqueLabel value the agent itself wrote. The label
// is GFD's: the agent writes it only where it is absent, and later changes or removes it only
// while it still holds the value the agent wrote, so the two never fight over it.
func (n Names) CliquePublishedAnnotation() string { return n.label(cliqueByAgent) }

// CliqueNone is PodCliqueAnnotation's value on a group's pods kept out of every clique: a group
// no clique can hold, run on nodes outside them (with a required DoesNotExist on
// GPUCliqueLabel), over the network between nodes.
const CliqueNone = "none"

// ComputeDomainName is the ComputeDomain nvdomain keeps for the tensor-parallel groups of
// LeaderWorkerSet lws (one for the LeaderWorkerSet: NVIDIA's driver runs an IMEX domain per
// clique inside it, and each group is in one clique), owned by the LeaderWorkerSet.
func ComputeDomainName(lws string) string { return "nvdomain-" + lws }

// ComputeDomainChannelTemplate is the ResourceClaimTemplate NVIDIA's ComputeDomain controller
// makes for ComputeDomainName(lws) (its spec.channel.resourceClaimTemplate.name).
func ComputeDomainChannelTemplate(lws string) string { return "nvdomain-" + lws + "-imex" }

// PodGroupName is the PodGroup of group index of LeaderWorkerSet lws at template revision
// rev, the name LeaderWorkerSet's own Volcano integration gives its PodGroups: a group made
// again by a rolling update gets a new one.
func PodGroupName(lws, index, rev string) string {
	if rev == "" {
		return lws + "-" + index
	}
	return lws + "-" + index + "-" + rev
}

// PodGroupAnnotation, on a group's pod, names the PodGroup the webhook put it in
// (spec.schedulingGroup.podGroupName); the webhook's PodGroup controller makes it.
func (n Names) PodGroupAnnotation() string { return n.label(podGroupSuffix) }

// PodComputeDomainAnnotation, on a group's pod, names the ComputeDomain whose channel the
// webhook gave it (IMEXPodClaim); the webhook's IMEX controller keeps that ComputeDomain.
func (n Names) PodComputeDomainAnnotation() string { return n.label(podComputeDomainSuffix) }

// PodCliqueAnnotation, on a pod of a group (a LeaderWorkerSet group), is the multi-node
// NVLink clique (GPUCliqueLabel value) the webhook pinned the group to; the pod also requires
// that label value through node affinity. The group's later pods follow it.
func (n Names) PodCliqueAnnotation() string { return n.label(podCliqueSuffix) }

// ParseDomainSizeLabel returns the domain id of a DomainSizeLabel key; ok is false for any
// other key, including DomainMaxLabel and DomainCountLabel.
func (n Names) ParseDomainSizeLabel(key string) (id int, ok bool) {
	return parseIndexed(key, n.label(domainSuffix))
}

// Node annotations.

// DomainGPUsAnnotation is the node annotation listing the GPU indexes of domain id, e.g.
// "0,1,2,3". Label values cannot hold commas, hence an annotation.
func (n Names) DomainGPUsAnnotation(id int) string {
	return n.resource(domainGPUsSuffix + strconv.Itoa(id))
}

// ParseDomainGPUsAnnotation returns the domain id of a DomainGPUsAnnotation key.
func (n Names) ParseDomainGPUsAnnotation(key string) (id int, ok bool) {
	return parseIndexed(key, n.resource(domainGPUsSuffix))
}

// TopologyAnnotation is the node annotation holding the full topology as JSON.
func (n Names) TopologyAnnotation() string { return n.label(topologySuffix) }

// FailClosedProvenAnnotation is on a node while a canary refused there proves it fail-closed,
// with the node's boot ID then as its value: with node.requireFailClosed only such a node
// offers domain room. The NvdomainFailClosed condition says what the last canary found, which
// may be Unknown after a proof; this says whether the proof stands, across agent restarts,
// and not across a reboot or a reimage (another boot ID), after which the node waits for its
// own canary again.
func (n Names) FailClosedProvenAnnotation() string { return n.label(failClosedProven) }

// NotProven is FailClosedProvenAnnotation's value on a node no canary proves during this boot.
const NotProven = "no"

// Extended resources.

// DomainResource is the extended resource counting the GPUs of domain id, e.g.
// nvidia.com/nvswitch-domain-1.
func (n Names) DomainResource(id int) string { return n.resource(domainSuffix + strconv.Itoa(id)) }

// DomainResourcePrefix is what every DomainResource name starts with, e.g.
// nvidia.com/nvswitch-domain-: the entry a queue's resource exclusions (Kueue's
// resources.excludeResourcePrefixes) need so that quota counts nvidia.com/gpu only.
func (n Names) DomainResourcePrefix() string { return n.resource(domainSuffix) }

// ParseDomainResource returns the domain id of a DomainResource name.
func (n Names) ParseDomainResource(name string) (id int, ok bool) {
	return parseIndexed(name, n.resource(domainSuffix))
}

// IsDomainResource reports whether name is one of nvdomain's per-domain resources.
func (n Names) IsDomainResource(name string) bool {
	_, ok := n.ParseDomainResource(name)
	return ok
}

// Pod annotations.

// PodDomainAnnotation holds the domain id the webhook chose for the pod.
func (n Names) PodDomainAnnotation() string { return n.label(podDomainSuffix) }

// PodTPSizeAnnotation holds the pod's tensor-parallel size.
func (n Names) PodTPSizeAnnotation() string { return n.label(podTPSizeSuffix) }

// PodContainerGPUsAnnotation holds the GPUs per container name as JSON, e.g. {"vllm":4}.
func (n Names) PodContainerGPUsAnnotation() string { return n.label(podContainerSuffix) }

// PodAssignedGPUsAnnotation reports the GPUs the node assigned, e.g. "4,5".
func (n Names) PodAssignedGPUsAnnotation() string { return n.label(podAssignedSuffix) }

// NRIHandledAnnotation is the OCI annotation the NRI plugin puts on every container it
// handled (its value: the GPUs it left the container, or "none"). Its validator refuses a
// container that requires the plugin and lacks it in the final adjustment: the plugin's
// create request timed out, its connection dropped mid-create, or another plugin took the
// annotation away.
func (n Names) NRIHandledAnnotation() string { return n.label(nriHandledSuffix) }

// PodAdmissionAnnotation records the admission request that pinned the pod, so that the same
// create coming back to the webhook (a re-invoked admission) is told from a pod whose pin was
// copied from another: only the replica that holds that request's reservation trusts it.
func (n Names) PodAdmissionAnnotation() string { return n.label(podAdmissionSuffix) }

// parseIndexed parses prefix+<non-negative decimal> without leading zeros or signs, so that
// every id has exactly one spelling and "nvswitch-domain-max" never parses as an id.
func parseIndexed(s, prefix string) (int, bool) {
	rest, ok := strings.CutPrefix(s, prefix)
	if !ok || rest == "" || len(rest) > 4 {
		return 0, false
	}
	if len(rest) > 1 && rest[0] == '0' {
		return 0, false
	}
	for _, c := range rest {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	id, err := strconv.Atoi(rest)
	if err != nil {
		return 0, false
	}
	return id, true
}

// FormatGPUList renders GPU indexes as the comma-separated list used in annotations.
func FormatGPUList(gpus []int) string {
	parts := make([]string, len(gpus))
	for i, g := range gpus {
		parts[i] = strconv.Itoa(g)
	}
	return strings.Join(parts, ",")
}

// ParseGPUList parses a FormatGPUList value. An empty string is an empty list.
func ParseGPUList(s string) ([]int, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	parts := strings.Split(s, ",")
	out := make([]int, 0, len(parts))
	for i, p := range parts {
		v, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || v < 0 {
			return nil, fmt.Errorf("GPU list %q: item %d (%q) is not a GPU index", s, i, p)
		}
		out = append(out, v)
	}
	return out, nil
}

// validateDNSSubdomain checks the RFC 1123 subdomain rule Kubernetes applies to the prefix of a
// qualified name. It is re-implemented here, in a dozen lines, to keep this leaf package free
// of Kubernetes imports.
func validateDNSSubdomain(s string) error {
	if s == "" {
		return fmt.Errorf("must not be empty")
	}
	if len(s) > 253 {
		return fmt.Errorf("must be at most 253 characters")
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 {
			return fmt.Errorf("must be a DNS subdomain such as gpu.example.com")
		}
		for i, c := range label {
			alnum := (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')
			if !alnum && (c != '-' || i == 0 || i == len(label)-1) {
				return fmt.Errorf("must be a DNS subdomain (lower-case letters, digits, '-' and '.') such as gpu.example.com")
			}
		}
	}
	return nil
}

// BindFlags registers --label-prefix and --resource-prefix on fs and returns a function that
// builds the Names from them once fs is parsed, so every binary spells the flags alike.
func BindFlags(fs *flag.FlagSet) func() (Names, error) {
	label := fs.String("label-prefix", DefaultLabelPrefix, "prefix of nvdomain's labels and annotations")
	resource := fs.String("resource-prefix", DefaultResourcePrefix, "prefix of the per-domain extended resources")
	return func() (Names, error) { return New(*label, *resource) }
}

// DRA mode: on node pools labelled ModeLabel=ModeDRA, nvdomain is the GPU driver of Dynamic
// Resource Allocation and the kube-scheduler's allocator picks a TP pod's GPUs inside one
// domain (docs/dra.md). These names are fixed: the driver name is the API contract between
// the ResourceSlices, the DeviceClass, the ResourceClaimTemplates and the CDI devices.
const (
	// DRADriver is the DRA driver name: ResourceSlices' spec.driver, the domain of every device
	// attribute and capacity, and the vendor of the CDI devices the driver writes.
	DRADriver = "gpu.nvdomain.io"
	// DRADeviceClass selects the single GPUs of DRADriver (not its blocks); it maps the
	// extended resource nvidia.com/gpu onto DRA on nodes that do not advertise it, so plain GPU
	// pods run there.
	DRADeviceClass = "gpu.nvdomain.io"
	// DRABlockDeviceClass selects the aligned blocks of DRADriver: one device that stands for
	// 2, 4, 8 or 16 GPUs of one domain (pkg/dra). The nvdomain-tp-<k> templates ask for one.
	DRABlockDeviceClass = "gpu-block.nvdomain.io"
	// DRADevicePrefix starts a GPU's device name in a ResourceSlice: gpu-<index>.
	DRADevicePrefix = "gpu-"
	// DRABlockPrefix starts a block's device name: gpus-<index>-<index>-…, the block's GPUs
	// in ascending order, so the name alone says what the block holds.
	DRABlockPrefix = "gpus-"
	// DRAMaxBlockSize is the largest block published: its name (16 GPUs of up to 2 digits)
	// stays a DNS label, and no node has an NVSwitch domain larger than 16 GPUs of its own.
	DRAMaxBlockSize = 16
	// DRACounterSetPrefix starts the shared counter set of one domain on a node:
	// domain-<id>, one counter per GPU (named like the GPU's device) of value 1, which the GPU's
	// own device and every block holding it consume. The allocator therefore never hands out
	// two devices that overlap.
	DRACounterSetPrefix = "domain-"
	// Device attributes, qualified by the driver (QualifiedAttribute). nvswitchDomain is absent
	// on GPUs in no domain, so a claim constrained to one domain never gets them.
	DRAAttrDomain     = "nvswitchDomain"
	DRAAttrDomainSize = "nvswitchDomainSize"
	DRAAttrIndex      = "index"
	DRAAttrUUID       = "uuid"
	DRAAttrProduct    = "productName"
	DRAAttrClique     = "fabricClique"
	// DRATaintUnhealthy is the device taint (effect NoSchedule) the driver puts on the devices
	// of an unhealthy GPU and on every block holding it.
	DRATaintUnhealthy = DRADriver + "/unhealthy"
	// DRATaintXID (value: the XID, e.g. "48") and DRATaintGPULost name the problem beside
	// DRATaintUnhealthy, one taint each, in the schema of NVIDIA's driver (gpu.nvidia.com/xid,
	// gpu-lost): a critical XID the agent's watcher saw the GPU raise since boot, and a GPU
	// NVML lost.
	DRATaintXID     = DRADriver + "/xid"
	DRATaintGPULost = DRADriver + "/gpu-lost"
	// DRATaintHeld is the device taint (effect NoSchedule) the driver puts on every device it
	// publishes that shares a GPU with a device a prepared claim holds but the driver no longer
	// publishes (a block, after blocks were switched off or fell back, or a topology change).
	// The allocator counts a held device's counters only while the device is in a slice, so
	// without the taint it would offer those GPUs again; the taint goes with the Unprepare.
	DRATaintHeld = DRADriver + "/held"
	// DRATaintReserved (value: the waiter's GPU count k) is the NoSchedule device taint the
	// driver puts on every device of a domain reserved for a waiting TP pod of k GPUs
	// (pkg/dra, "Reservations without pins"); the nvdomain-tp-<k'> templates of k' ≥ k
	// tolerate it, and the dra-blocks policy refuses any other claim or template that does.
	DRATaintReserved = DRADriver + "/reserved"
	// DRAReservationsConfigMap, in the release's namespace, carries the reservations the
	// webhook's elected replica makes: one key per node, a JSON list of dra.Reservation. The
	// DRA drivers read their node's key.
	DRAReservationsConfigMap = "nvdomain-dra-reservations"
	// DRAAttrBlockSize is a block's GPU count; single GPUs do not have it, which is what the
	// two DeviceClasses select on.
	DRAAttrBlockSize = "blockSize"
	// DRACapacityMemory is the device capacity holding the GPU's memory.
	DRACapacityMemory = "memory"
	// DRATemplatePrefix starts the ResourceClaimTemplate of a TP size: nvdomain-tp-<k>.
	DRATemplatePrefix = "nvdomain-tp-"
	// DRARequest is the one request of every nvdomain-tp-<k> template: the GPUs.
	DRARequest = "gpus"
	// The subrequests of a template's request (its firstAvailable list), most preferred first:
	// the scheduler scores a node by the first one that fits there, and the allocator tries
	// them in order on the node it chose.
	//   - DRASubBlock: one aligned block of k GPUs (the driver lists blocks smallest domain
	//     first, so the allocator takes the one in the domain nearest the pod's size);
	//   - DRASubAny: k single GPUs that share one domain, aligned or not (what classic mode's
	//     chooser falls back to as well).
	DRASubBlock = "block"
	DRASubAny   = "any-gpus"
	// DRAPodClaim is the name of the pod's spec.resourceClaims entry the webhook adds, which
	// the GPU containers' resources.claims reference.
	DRAPodClaim = "nvdomain-gpus"
	// DRAMaxDevicesPerClaim is the most devices one ResourceClaim may hold (resource.k8s.io/v1),
	// so the largest TP size DRA mode serves.
	DRAMaxDevicesPerClaim = 32
	// DRAManagedByLabel marks the ResourceClaimTemplates nvdomain keeps, so it never touches
	// a template it did not write.
	DRAManagedByLabel = "app.kubernetes.io/managed-by"
	DRAManagedByValue = "nvdomain"
)

// The chart's node pods, for the tools that look for them (kubectl nvdomain status).
const (
	// NodePodSelector selects the pods of both node DaemonSets (classic and DRA) of every
	// release; the chart labels them so.
	NodePodSelector = "app.kubernetes.io/name=nvdomain,app.kubernetes.io/component in (node,node-dra)"
	// GPUPresentLabel is the GPU Operator's (and GPU feature discovery's) mark of a GPU node,
	// the node DaemonSets' default nodeSelector.
	GPUPresentLabel = "nvidia.com/gpu.present"
)

// Values of the node mode label (Names.ModeLabel).
const (
	// ModeClassic is the default, also when the label is absent: the webhook pins TP pods to a
	// domain id and the NRI plugin picks the GPUs.
	ModeClassic = "classic"
	// ModeDRA marks a node whose GPUs nvdomain publishes as DRA devices.
	ModeDRA = "dra"
)

// QualifiedAttribute is a device attribute or capacity name as claims and CEL spell it,
// gpu.nvdomain.io/<name>.
func QualifiedAttribute(name string) string { return DRADriver + "/" + name }

// DRADeviceName is a GPU's device name in the ResourceSlice: gpu-<index>.
func DRADeviceName(index int) string { return DRADevicePrefix + strconv.Itoa(index) }

// ParseDRADeviceName returns the GPU index of a DRADeviceName.
func ParseDRADeviceName(name string) (int, bool) { return parseIndexed(name, DRADevicePrefix) }

// DRABlockName is the device name of a block of GPUs: gpus-<i>-<j>-…, in the order given.
func DRABlockName(gpus []int) string {
	var b strings.Builder
	b.WriteString(DRABlockPrefix)
	for i, g := range gpus {
		if i > 0 {
			b.WriteByte('-')
		}
		b.WriteString(strconv.Itoa(g))
	}
	return b.String()
}

// ParseDRADeviceGPUs returns the GPU indexes a device of DRADriver stands for: one for a
// GPU (gpu-<index>), the block's for a block (gpus-<i>-<j>-…, at least two, ascending).
func ParseDRADeviceGPUs(name string) ([]int, bool) {
	if g, ok := ParseDRADeviceName(name); ok {
		return []int{g}, true
	}
	rest, ok := strings.CutPrefix(name, DRABlockPrefix)
	if !ok {
		return nil, false
	}
	parts := strings.Split(rest, "-")
	if len(parts) < 2 || len(parts) > DRAMaxBlockSize {
		return nil, false
	}
	out := make([]int, 0, len(parts))
	for _, p := range parts {
		g, ok := parseIndexed(DRADevicePrefix+p, DRADevicePrefix)
		if !ok || (len(out) > 0 && g <= out[len(out)-1]) {
			return nil, false
		}
		out = append(out, g)
	}
	return out, true
}

// DRACounterSet is the shared counter set of a node's domain: domain-<id>.
func DRACounterSet(domain int) string { return DRACounterSetPrefix + strconv.Itoa(domain) }

// DRATemplate is the ResourceClaimTemplate for a TP size k: nvdomain-tp-<k>.
func DRATemplate(k int) string { return DRATemplatePrefix + strconv.Itoa(k) }

// ParseDRATemplate returns the TP size of a DRATemplate name.
func ParseDRATemplate(name string) (int, bool) { return parseIndexed(name, DRATemplatePrefix) }

const modeSuffix = "nvdomain-mode"

// ModeLabel is the node label that says whether nvdomain serves the node's GPUs classically
// (absent or ModeClassic) or as DRA devices (ModeDRA). The operator sets it on a node pool to
// choose; the agent started with --dra sets it too, and never removes it.
func (n Names) ModeLabel() string { return n.label(modeSuffix) }

// IsGPUDevicePluginResource reports whether a resource name is one a GPU device plugin
// advertises: nvidia.com/gpu, its time-slicing and MPS renames (nvidia.com/gpu.shared, any
// nvidia.com/gpu.<x> or nvidia.com/gpu-<x>), and the MIG slices of the mixed strategy
// (nvidia.com/mig-<profile>). Other nvidia.com/ resources are not GPUs: the Network
// Operator's NICs (nvidia.com/hostdev, nvidia.com/mlnx_sriov_rdma) and IMEX channels. A rename
// to a name without "gpu" or "mig" is not recognised (docs/dra.md).
func IsGPUDevicePluginResource(name string) bool {
	rest, ok := strings.CutPrefix(name, NVIDIAPrefix)
	return ok && (rest == "gpu" || strings.HasPrefix(rest, "gpu.") || strings.HasPrefix(rest, "gpu-") || strings.HasPrefix(rest, "mig-"))
}

package nriplugin

import (
	"flag"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/nvdomain/nvdomain/pkg/cdispec"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/nristate"
)

// BindFlags registers nvdomain-nri's flags on fs. The function it returns, called after
// fs.Parse, finishes the options (lists split and checked, deprecated flags reported); the
// caller fills in Names.
func BindFlags(fs *flag.FlagSet) func(logr.Logger) (RunOptions, error) {
	var o RunOptions
	// The agent's flags: --source and its file. An empty --source is inferred from the file
	// given, as manifests of releases before --source name it.
	o.Topology.AddFlags(fs, "")
	fs.StringVar(&o.NodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name (simulated topology, events)")
	nvmlFlag := fs.Bool("nvml", false, "deprecated: use --source nvml")
	fs.StringVar(&o.CDIKind, "cdi-kind", cdispec.DevicePluginGPU.String(), "CDI kind (vendor/class) to add GPUs with when a container came with GPU device nodes but no CDI names")
	fs.BoolVar(&o.SharedGPUs, "shared-gpus", false, "the node time-slices its GPUs: leave GPU containers without a domain as the device plugin made them, refuse tensor-parallel ones")
	fs.StringVar(&o.HookDir, "hook-dir", "", "mounted host directory holding the hook the chart installed, removed at the end of an uninstall once no pod here requires the plugin; empty: none")
	fs.StringVar(&o.ContainerdConfDir, "containerd-conf-dir", "", "mounted host directory holding containerd's NRI snippet the chart installed, removed with the hook; empty: none")
	fs.StringVar(&o.HookPath, "hook-path", "", "node-side path of nvdomain-nri-hook, which removes the device nodes of GPUs a container must not have (empty: they stay, denied by the device cgroup)")
	cdiDirs := fs.String("cdi-spec-dirs", "/etc/cdi,/var/run/cdi", "comma-separated CDI spec directories, to know every device node a GPU's CDI device brings")
	strategies := fs.String("device-list-strategy", strings.Join(names.DefaultDeviceListStrategies, ","),
		"the node's device plugin's DEVICE_LIST_STRATEGY, a comma-separated list of envvar, volume-mounts, cdi-annotations, cdi-cri: only these forms count as GPUs a container was given, and NVIDIA_VISIBLE_DEVICES naming devices without envvar is set to void")
	trusted := fs.String("trusted-namespaces", strings.Join(names.DefaultTrustedNamespaces, ","),
		"comma-separated namespaces whose containers are left exactly as they are (system components such as GPU Operator's, which set NVIDIA_VISIBLE_DEVICES=all on purpose)")
	naming := fs.String("naming", "", "deprecated and ignored (GPUs are named as the device plugin named them)")
	fs.StringVar(&o.PodResourcesSocket, "pod-resources-socket", "", "the kubelet's PodResources socket (/var/lib/kubelet/pod-resources/kubelet.sock), asked under the envvar strategy whether a GPU list in NVIDIA_VISIBLE_DEVICES is the device plugin's, and with --dra whether a container's GPUs came from a device plugin rather than its claims; empty: not asked")
	fs.BoolVar(&o.DRA, "dra", false, "the node is a DRA node: check that a tensor-parallel container's prepared GPUs share one domain and record them, rewrite nothing")
	fs.DurationVar(&o.TopologyReload, "topology-reload", 30*time.Second, "how often the topology source is read again (0: once)")
	fs.StringVar(&o.StateFile, "state-file", nristate.DefaultPath, "where to write which container holds which GPUs, for the node agent")
	fs.StringVar(&o.MetricsAddr, "metrics-bind-address", "", "Prometheus /metrics and the /healthz and /readyz probes, e.g. 127.0.0.1:9101; empty disables")
	fs.StringVar(&o.SocketPath, "socket-path", "", "NRI socket (external plugin); empty when containerd launches the plugin")
	fs.StringVar(&o.PluginName, "plugin-name", "", "plugin name (external plugin)")
	fs.StringVar(&o.PluginIdx, "plugin-idx", "", "plugin index, two digits (external plugin)")
	fs.BoolVar(&o.Report, "report", true, "annotate pods with their GPUs and record Events through the API")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig for reports; empty means in-cluster")
	fs.StringVar(&o.DaemonSet, "daemonset", "", "this pod's DaemonSet: its uninstall mark turns the plugin pass-through (docs/operations.md, Uninstall); empty: never (needs --report)")
	fs.StringVar(&o.Namespace, "namespace", os.Getenv("POD_NAMESPACE"), "this pod's namespace (the DaemonSet's)")
	return func(log logr.Logger) (RunOptions, error) {
		out := o
		if *nvmlFlag && out.Topology.Source == "" {
			out.Topology.Source = names.SourceNVML
		}
		out.Topology.Infer()
		out.CDISpecDirs = splitList(*cdiDirs)
		out.TrustedNamespaces = splitList(*trusted)
		var err error
		if out.DeviceListStrategies, err = names.ParseDeviceListStrategies(*strategies); err != nil {
			return RunOptions{}, err
		}
		// --naming went away when the plugin learnt to name GPUs the way the device plugin
		// did; manifests of older releases still pass it, and failing on it would crash-loop
		// the plugin, refusing every GPU container on the node.
		fs.Visit(func(f *flag.Flag) {
			switch f.Name {
			case "naming":
				log.Info("DEPRECATED: --naming is ignored and will be removed; GPUs are named as the device plugin named them", "naming", *naming)
			case "nvml":
				log.Info("DEPRECATED: --nvml will be removed; pass --source nvml, as the agent does")
			}
		})
		return out, nil
	}
}

func splitList(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}

// Command nvdomain-agent publishes this node's NVLink domains as labels, annotations and
// per-domain extended resources, and optionally serves simulated GPUs to the kubelet; with
// --dra it is the node's DRA driver instead. See packages agent and dra (the scale runs publish
// many fake nodes from one process with test/fleet instead).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/nvdomain/nvdomain/pkg/agent"
	"github.com/nvdomain/nvdomain/pkg/deviceplugin"
	"github.com/nvdomain/nvdomain/pkg/dra"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/nristate"
)

func main() {
	o := agent.ProcessOptions{}
	flag.StringVar(&o.Node, "node-name", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME)")
	o.Topology.AddFlags(flag.CommandLine, names.SourceNVML)
	flag.StringVar(&o.ConfigMap, "configmap", "nvdomain-system/nvdomain-topology", "namespace/name of the simulated-topology ConfigMap (--source simulated without --simulated-file)")
	flag.DurationVar(&o.Period, "period", 30*time.Second, "how often everything is re-asserted")
	flag.StringVar(&o.NRIStateFile, "nri-state-file", nristate.DefaultPath, "the NRI plugin's state file; empty disables account-mode capacity")
	flag.StringVar(&o.ProbeAddr, "probe-bind-address", ":8082", "address for /healthz, /readyz and /metrics; empty disables")
	flag.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig; empty means in-cluster")
	flag.BoolVar(&o.DevicePlugin, "device-plugin", false, "serve the topology's GPUs to the kubelet as nvidia.com/gpu (simulated GPUs)")
	flag.StringVar(&o.DevicePluginDir, "device-plugin-dir", "/var/lib/kubelet/device-plugins", "the kubelet's device-plugin directory")
	strategies := flag.String("device-list-strategy", strings.Join(deviceplugin.DefaultStrategies, ","), "how the device plugin hands GPUs to containers, as NVIDIA's does: a comma-separated list of envvar, volume-mounts, cdi-annotations, cdi-cri")
	flag.StringVar(&o.CDISpecDir, "cdi-spec-dir", "/var/run/cdi", "where the device plugin, or the DRA driver, writes its CDI specs (a directory in containerd's cdi_spec_dirs)")
	flag.BoolVar(&o.DRA, "dra", false, "run the DRA driver "+names.DRADriver+" for this node (docs/dra.md): publish its GPUs as ResourceSlice devices, prepare claims, label the node "+names.DefaultLabelPrefix+"/nvdomain-mode=dra and publish no per-domain extended resources; excludes --device-plugin")
	// The chart passes it as $NVDOMAIN_DRA_NVIDIA_CDI_DIRS, which an older image ignores.
	o.DRANVIDIASpecDirs = splitDirs(os.Getenv("NVDOMAIN_DRA_NVIDIA_CDI_DIRS"))
	flag.Func("dra-nvidia-cdi-dirs", "($NVDOMAIN_DRA_NVIDIA_CDI_DIRS) comma-separated CDI spec directories of the container runtime (containerd's cdi_spec_dirs) where, with --dra-cdi=nvidia, each new claim's GPUs must be named by NVIDIA's spec (nvidia.com/gpu=<uuid> or =<index>), so a missing or mismatched spec is refused at Prepare with the fix instead of failing at container creation; empty: not checked", func(v string) error {
		o.DRANVIDIASpecDirs = splitDirs(v)
		return nil
	})
	// $NVDOMAIN_DRA_RESERVATIONS=true (the chart sets it with dra.reservations): the driver
	// reads its node's reservations (docs/dra.md); an environment variable, which an older
	// image ignores, and without it no node reads the ConfigMap at all.
	o.DRAReservations = os.Getenv("NVDOMAIN_DRA_RESERVATIONS") == "true"
	flag.StringVar(&o.DRAKubeletDir, "dra-kubelet-dir", dra.DefaultKubeletDir, "the kubelet's --root-dir, where the DRA driver registers (plugins_registry) and keeps its socket and checkpoint (plugins/"+names.DRADriver+")")
	flag.BoolVar(&o.DRABlocks, "dra-blocks", false, "with --dra, publish each NVSwitch domain's aligned blocks of 2-16 GPUs as devices sharing per-GPU counters with the GPUs (partitionable devices; the driver falls back to GPUs alone where the apiserver drops the counters)")
	flag.StringVar(&o.DRACDI, "dra-cdi", "auto", "CDI devices of prepared claims: nvdomain (the driver writes per-claim specs; simulated GPUs), nvidia (nvidia.com/gpu=<uuid> from nvidia-ctk's spec), or auto (nvdomain for --source simulated, else nvidia)")
	flag.StringVar(&o.Release, "release", "", "the Helm release this pod belongs to (uninstall protocol)")
	flag.StringVar(&o.Namespace, "namespace", os.Getenv("POD_NAMESPACE"), "this pod's namespace")
	flag.StringVar(&o.DaemonSet, "daemonset", "", "this pod's DaemonSet, whose uninstall mark makes the agent take its node's state down (docs/operations.md, Uninstall); empty: never")
	flag.StringVar(&o.Pod, "pod-name", os.Getenv("POD_NAME"), "this pod's name")
	flag.StringVar(&o.HookDir, "hook-dir", "", "host directory holding the OCI hook the chart installed, removed on uninstall; empty: none")
	flag.StringVar(&o.ContainerdConfDir, "containerd-conf-dir", "", "containerd drop-in directory holding the NRI snippet the chart wrote, removed on uninstall; empty: none")
	flag.StringVar(&o.Canary.Image, "canary-image", "", "image of the fail-closed canary pod (the release image); empty: no canary (docs/node-side.md)")
	flag.DurationVar(&o.Canary.Interval, "canary-interval", 6*time.Hour, "time between fail-closed canaries")
	flag.DurationVar(&o.Canary.Timeout, "canary-timeout", 2*time.Minute, "how long one canary may take to be decided")
	flag.Func("canary-image-pull-secrets", "comma-separated imagePullSecrets of the canary pod (the release's)", func(v string) error {
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				o.Canary.PullSecrets = append(o.Canary.PullSecrets, s)
			}
		}
		return nil
	})
	flag.BoolVar(&o.Canary.WithholdCapacity, "require-fail-closed", true, "publish no domain room until a canary is refused on this node (a fresh node, or one whose containerd does not enforce NRI's required plugins); needs --canary-image")
	qps := flag.Float64("kube-api-qps", 0, "requests per second to the apiserver (0: client-go's 5)")
	flag.IntVar(&o.KubeAPIBurst, "kube-api-burst", 0, "request burst to the apiserver (0: client-go's 10)")
	namesFromFlags := names.BindFlags(flag.CommandLine)
	zo := zap.Options{}
	zo.BindFlags(flag.CommandLine)
	flag.Parse()

	log := zap.New(zap.UseFlagOptions(&zo)).WithName("nvdomain-agent")
	o.DeviceListStrategies = strings.Split(*strategies, ",")
	o.KubeAPIQPS = float32(*qps)
	var err error
	if o.Names, err = namesFromFlags(); err == nil {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err = agent.RunProcess(ctx, o, log)
		stop()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "nvdomain-agent: %v\n", err)
		os.Exit(1)
	}
}

// splitDirs reads a comma-separated list of directories, without empty items.
func splitDirs(v string) []string {
	var out []string
	for _, d := range strings.Split(v, ",") {
		if d = strings.TrimSpace(d); d != "" {
			out = append(out, d)
		}
	}
	return out
}

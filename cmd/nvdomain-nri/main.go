// Command nvdomain-nri is nvdomain's containerd NRI plugin: it gives each GPU container the
// exact GPUs of its pod's NVSwitch domain. It runs as an external plugin (a DaemonSet with the
// NRI socket mounted) or pre-installed in containerd's plugin_path. See package nriplugin.
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

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/nvdomain/nvdomain/nri-plugin"
	"github.com/nvdomain/nvdomain/pkg/cdispec"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/nristate"
)

func main() {
	o := nriplugin.RunOptions{Names: names.Default()}
	flag.StringVar(&o.TopologyFile, "topology-file", "", "node topology JSON (as `nvdomain topology parse|discover -o json` prints it)")
	flag.StringVar(&o.TopoMatrixFile, "topo-matrix-file", "", "saved `nvidia-smi topo -m` output (parsed strictly)")
	flag.StringVar(&o.SimulatedFile, "simulated-file", "", "simulated-topology document; needs --node-name")
	flag.StringVar(&o.NodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name (simulated topology, events)")
	flag.BoolVar(&o.NVML, "nvml", false, "discover the topology through NVML")
	flag.StringVar(&o.CDIKind, "cdi-kind", cdispec.DevicePluginGPU.String(), "CDI kind (vendor/class) to add GPUs with when a container came with GPU device nodes but no CDI names")
	flag.BoolVar(&o.SharedGPUs, "shared-gpus", false, "the node time-slices its GPUs: leave GPU containers without a domain as the device plugin made them, refuse tensor-parallel ones")
	flag.StringVar(&o.HookPath, "hook-path", "", "node-side path of nvdomain-nri-hook, which removes the device nodes of GPUs a container must not have (empty: they stay, denied by the device cgroup)")
	cdiDirs := flag.String("cdi-spec-dirs", "/etc/cdi,/var/run/cdi", "comma-separated CDI spec directories, to know every device node a GPU's CDI device brings")
	flag.BoolVar(&o.DRA, "dra", false, "the node is a DRA node: check that a tensor-parallel container's prepared GPUs share one domain and record them, rewrite nothing")
	flag.DurationVar(&o.TopologyReload, "topology-reload", 30*time.Second, "how often the topology source is read again (0: once)")
	flag.StringVar(&o.StateFile, "state-file", nristate.DefaultPath, "where to write which container holds which GPUs, for the node agent")
	flag.StringVar(&o.MetricsAddr, "metrics-bind-address", "", "Prometheus metrics address, e.g. 127.0.0.1:9101; empty disables")
	flag.StringVar(&o.SocketPath, "socket-path", "", "NRI socket (external plugin); empty when containerd launches the plugin")
	flag.StringVar(&o.PluginName, "plugin-name", "", "plugin name (external plugin)")
	flag.StringVar(&o.PluginIdx, "plugin-idx", "", "plugin index, two digits (external plugin)")
	flag.BoolVar(&o.Report, "report", true, "annotate pods with their GPUs and record Events through the API")
	flag.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig for reports; empty means in-cluster")
	namesFromFlags := names.BindFlags(flag.CommandLine)
	zo := zap.Options{}
	zo.BindFlags(flag.CommandLine)
	flag.Parse()

	log := zap.New(zap.UseFlagOptions(&zo)).WithName("nvdomain-nri")
	for _, d := range strings.Split(*cdiDirs, ",") {
		if d = strings.TrimSpace(d); d != "" {
			o.CDISpecDirs = append(o.CDISpecDirs, d)
		}
	}
	if err := run(o, namesFromFlags, log); err != nil {
		fmt.Fprintf(os.Stderr, "nvdomain-nri: %v\n", err)
		os.Exit(1)
	}
}

func run(o nriplugin.RunOptions, namesFromFlags func() (names.Names, error), log logr.Logger) error {
	var err error
	if o.Names, err = namesFromFlags(); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return nriplugin.Run(ctx, o, log)
}

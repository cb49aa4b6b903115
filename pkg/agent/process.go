package agent

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nvdomain/nvdomain/pkg/deviceplugin"
	"github.com/nvdomain/nvdomain/pkg/dra"
	"github.com/nvdomain/nvdomain/pkg/lifecycle"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/probes"
	"github.com/nvdomain/nvdomain/pkg/topology"
	"github.com/nvdomain/nvdomain/pkg/topology/simulated"
	"github.com/nvdomain/nvdomain/pkg/topology/source"
	"github.com/nvdomain/nvdomain/pkg/version"
)

// ProcessOptions are the agent binary's settings.
type ProcessOptions struct {
	Names names.Names
	Node  string
	// Topology is the topology source (--source and its file), shared with the NRI plugin;
	// simulated without a file reads ConfigMap (namespace/name).
	Topology     source.Flags
	ConfigMap    string
	Period       time.Duration
	NRIStateFile string
	// ProbeAddr serves /healthz, /readyz and /metrics; empty disables.
	ProbeAddr  string
	Kubeconfig string
	// DevicePlugin serves nvidia.com/gpu for the topology's GPUs from DevicePluginDir.
	DevicePlugin    bool
	DevicePluginDir string
	// DeviceListStrategies and CDISpecDir shape the device plugin's answers (see
	// deviceplugin.Options).
	DeviceListStrategies []string
	CDISpecDir           string
	// KubeAPIQPS and KubeAPIBurst bound the process's requests to the apiserver; 0 means
	// client-go's 5 and 10.
	KubeAPIQPS   float32
	KubeAPIBurst int
	// DRA runs the DRA driver (package dra) for this node, which must then have no device
	// plugin for nvidia.com/gpu; DRAKubeletDir is the kubelet's --root-dir and DRACDI names
	// the CDI devices prepared claims get (nvdomain, nvidia, or auto: nvidia for the nvml and
	// topo-matrix sources, which describe real GPUs, nvdomain for simulated ones). The
	// driver's CDI specs go to CDISpecDir.
	DRA           bool
	DRAKubeletDir string
	DRACDI        string
	// DRANVIDIASpecDirs are the runtime's CDI spec directories where, with --dra-cdi=nvidia,
	// each new claim's GPUs are looked up in NVIDIA's spec (dra.NVIDIASpecs).
	DRANVIDIASpecDirs []string
	// DRABlocks publishes each domain's aligned blocks beside its GPUs (dra.Options.Blocks).
	DRABlocks bool
	// DRAReservations has the driver read its node's reservations from the ConfigMap in
	// Namespace (dra.Options.ReservationsNamespace).
	DRAReservations bool
	// Release, Namespace, DaemonSet and Pod place this pod in its Helm release for the
	// uninstall protocol (package lifecycle); with DaemonSet empty the agent never uninstalls.
	// HookDir and ContainerdConfDir are where the chart's init containers put the OCI hook
	// and the NRI snippet (empty: not installed), removed on uninstall.
	Release, Namespace, DaemonSet, Pod string
	HookDir, ContainerdConfDir         string
	// Canary is the fail-closed canary; its pods are named <Release>-canary-<node> in
	// Namespace.
	Canary CanaryOptions
}

// Validate checks the settings that only make sense together.
func (o ProcessOptions) Validate() error {
	if o.DRA && o.DevicePlugin {
		return errors.New("--dra and --device-plugin are both set: a DRA node's GPUs are served by the DRA driver alone (a device plugin would offer the same GPUs to the scheduler twice); drop --device-plugin, or --dra for a classic node")
	}
	if o.DRA {
		if _, err := o.draCDI(); err != nil {
			return err
		}
	}
	return nil
}

func (o ProcessOptions) draCDI() (dra.CDIMode, error) {
	if o.DRACDI == "" || o.DRACDI == "auto" {
		if o.Topology.Source == names.SourceSimulated {
			return dra.CDINvdomain, nil
		}
		return dra.CDINVIDIA, nil
	}
	return dra.ParseCDIMode(o.DRACDI)
}

// RunProcess wires the agent (and, when asked, the simulated device plugin) and runs it.
func RunProcess(ctx context.Context, o ProcessOptions, log logr.Logger) error {
	if err := o.Validate(); err != nil {
		return err
	}
	if o.Node == "" {
		return errors.New("the node name is empty: pass --node-name or set NODE_NAME from the downward API (spec.nodeName)")
	}
	cfg, err := RestConfig(o.Kubeconfig, o.KubeAPIQPS, o.KubeAPIBurst)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	src, err := buildSource(ctx, o, client, log)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		return err
	}
	ao := Options{Names: o.Names, Node: o.Node, Source: src, Client: client, Period: o.Period, NRIStateFile: o.NRIStateFile, Log: log, Metrics: m, DRA: o.DRA,
		Uninstall: lifecycle.WatchUninstall(ctx, client, o.Names, o.Namespace, o.DaemonSet, log.WithName("lifecycle")),
		HookDir:   o.HookDir, ContainerdConfDir: o.ContainerdConfDir, Canary: o.Canary}
	ao.Canary.Namespace, ao.Canary.NamePrefix, ao.Canary.ServiceAccount = o.Namespace, o.Release+"-canary-", o.Release+"-canary"
	if ao.Canary.WithholdCapacity && ao.Canary.Image == "" && !o.DRA {
		// Nothing proves the node: its room is published as measured (chart: the canary needs
		// node.failClosedCanary.enabled and policies.enabled).
		log.Info("--require-fail-closed has no effect without --canary-image: this node offers domain room without being proven fail-closed")
	}
	if o.DaemonSet != "" {
		ao.Drainer = &lifecycle.Drainer{Client: client, Names: o.Names, Release: lifecycle.Release{Name: o.Release, Namespace: o.Namespace}, Pod: o.Pod, DaemonSet: o.DaemonSet, Log: log.WithName("lifecycle")}
	}
	var driver atomic.Pointer[dra.Driver]
	notReady := "no topology published yet"
	if o.DRA {
		notReady = "no topology published yet, or the kubelet has not registered the DRA driver " + names.DRADriver
		ao.TopologyLoaded = func(ctx context.Context, top *topology.Topology) {
			if d := driver.Load(); d != nil {
				if err := d.SetTopology(ctx, top); err != nil {
					log.Error(err, "publish the DRA devices of the reloaded topology")
				}
			}
		}
	}
	a := New(ao)
	ready := func() bool {
		if o.DRA {
			d := driver.Load()
			return a.Ready() && d != nil && d.Registered()
		}
		return a.Ready()
	}
	if o.ProbeAddr != "" {
		stop, err := probes.Serve(o.ProbeAddr, reg, ready, notReady)
		if err != nil {
			return err
		}
		defer stop()
	}
	// A dead device plugin or DRA server must not hide behind a Ready agent: its failure
	// ends the process.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// The DRA driver and the device plugin start from the first topology; until the source
	// yields one the agent waits, not ready, and says why on the Node (WaitForTopology).
	if o.DRA {
		top, err := a.WaitForTopology(ctx)
		if errors.Is(err, ErrUninstalling) {
			return a.Run(ctx) // the node's part of the uninstall
		}
		if err != nil {
			return nil
		}
		// The Node shows the topology before the driver's first slices do, as on every reload
		// (Agent.sync): the webhook's hint and `nvdomain status` never lag the allocator. A
		// failed publish is retried by Run.
		if err := a.publish(ctx); err != nil {
			log.Error(err, "publish the node before the DRA driver's first slices")
		}
		mode, _ := o.draCDI() // validated above
		dm, err := dra.NewMetrics(reg)
		if err != nil {
			return err
		}
		// The kubelet's PodResources socket under its root dir (the chart mounts it): which pods
		// run here, without `list pods` on the cluster. Dialled lazily; where it is not
		// mounted the driver asks the apiserver.
		pods, closePods, err := dra.DialPodResources(filepath.Join(o.DRAKubeletDir, "pod-resources", "kubelet.sock"))
		if err != nil {
			return err
		}
		defer func() { _ = closePods() }()
		d, err := dra.Start(ctx, dra.Options{Node: o.Node, Client: client, KubeletDir: o.DRAKubeletDir, CDI: mode, CDISpecDir: o.CDISpecDir, NVIDIASpecDirs: o.DRANVIDIASpecDirs,
			Topology: top, Blocks: o.DRABlocks, Pods: pods, Metrics: dm, ReservationsNamespace: reservationsNamespace(o), ModeLabel: o.Names.ModeLabel(), Log: log.WithName("dra"), Fatal: func(err error) { cancel(err) }})
		if err != nil {
			return err
		}
		defer d.Stop()
		driver.Store(d)
	}
	if o.DevicePlugin {
		top, err := a.WaitForTopology(ctx)
		if errors.Is(err, ErrUninstalling) {
			return a.Run(ctx) // the node's part of the uninstall
		}
		if err != nil {
			return nil
		}
		dp, err := deviceplugin.New(deviceplugin.Options{Dir: o.DevicePluginDir, SocketName: "nvdomain-gpu.sock", Topology: top,
			Strategies: o.DeviceListStrategies, CDISpecDir: o.CDISpecDir, Log: log.WithName("device-plugin")})
		if err != nil {
			return err
		}
		go func() {
			if err := dp.Run(ctx); err != nil {
				cancel(fmt.Errorf("device plugin: %w", err))
			}
		}()
	}
	log.Info("starting", "version", version.Version, "node", o.Node, "source", src.Describe(), "period", o.Period, "devicePlugin", o.DevicePlugin, "deviceListStrategies", o.DeviceListStrategies,
		"dra", o.DRA, "draKubeletDir", o.DRAKubeletDir, "draCDI", o.DRACDI, "draBlocks", o.DRABlocks)
	if err := a.Run(ctx); err != nil {
		return err
	}
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return nil
}

func buildSource(ctx context.Context, o ProcessOptions, client kubernetes.Interface, log logr.Logger) (source.Source, error) {
	src, err := o.Topology.Open(o.Node, source.KubeNodeLabels(client, o.Node))
	if nv, ok := src.(source.NVML); ok && err == nil && o.Topology.NVMLXIDs {
		// The agent publishes health, so it alone watches XIDs; the watcher ends with ctx.
		return nv.WatchXIDs(ctx, o.Topology.NVMLXIDIgnore, o.Topology.NVMLXIDMarksFile, log.WithName("xid")), nil
	}
	if err != nil || src != nil {
		return src, err
	}
	p, err := simulated.NewParser()
	if err != nil {
		return nil, err
	}
	ns, name, ok := cut(o.ConfigMap)
	if !ok {
		return nil, fmt.Errorf("--configmap %q: give namespace/name, e.g. nvdomain-system/nvdomain-topology", o.ConfigMap)
	}
	return NewConfigMapSource(ctx, client, ns, name, o.Node, p)
}

func cut(s string) (string, string, bool) {
	for i := range len(s) {
		if s[i] == '/' {
			return s[:i], s[i+1:], i > 0 && i < len(s)-1
		}
	}
	return "", "", false
}

// RestConfig is the client configuration of a node-side process: kubeconfig when given, else
// in-cluster, with its request rate bounded by qps and burst.
func RestConfig(kubeconfig string, qps float32, burst int) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		if cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig); err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
		}
	} else if cfg, err = rest.InClusterConfig(); err != nil {
		return nil, fmt.Errorf("in-cluster config: %w (outside a cluster pass --kubeconfig)", err)
	}
	cfg.QPS, cfg.Burst = qps, burst
	return cfg, nil
}

// reservationsNamespace is where the DRA driver reads reservations: the pod's namespace when
// they are on, none otherwise.
func reservationsNamespace(o ProcessOptions) string {
	if !o.DRAReservations {
		return ""
	}
	return o.Namespace
}

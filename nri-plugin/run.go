package nriplugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nvdomain/nvdomain/pkg/cdispec"
	"github.com/nvdomain/nvdomain/pkg/hostfiles"
	"github.com/nvdomain/nvdomain/pkg/lifecycle"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/nristate"
	"github.com/nvdomain/nvdomain/pkg/probes"
	"github.com/nvdomain/nvdomain/pkg/topology"
	"github.com/nvdomain/nvdomain/pkg/topology/source"
	"github.com/nvdomain/nvdomain/pkg/version"
)

// RunOptions configure the plugin process.
type RunOptions struct {
	Names names.Names
	// Topology is the topology source (--source and its file), shared with the agent;
	// simulated needs NodeName.
	Topology source.Flags
	NodeName string

	// CDIKind (vendor/class) names GPUs the plugin adds to containers that came with GPU
	// device nodes but no CDI names; SharedGPUs says the node time-slices its GPUs.
	CDIKind    string
	SharedGPUs bool
	// HookPath is the node-side path of nvdomain-nri-hook; CDISpecDirs are read to know each
	// CDI device's nodes (see Config).
	HookPath    string
	CDISpecDirs []string
	// HookDir and ContainerdConfDir are where the chart's install step put the hook and
	// containerd's NRI snippet on the host; the plugin removes both at the end of an
	// uninstall, once no pod on the node requires it. The plugin, not the agent, holds the
	// write access: the plugin can already give any container any OCI hook, the agent could
	// otherwise replace the binary runc runs as root (review node-side M1). Empty: none.
	HookDir, ContainerdConfDir string
	// DRA makes the plugin check, not rewrite (Config.DRA).
	DRA bool
	// DeviceListStrategies are the device plugin's, TrustedNamespaces those left alone
	// (Config).
	DeviceListStrategies []string
	TrustedNamespaces    []string
	// PodResourcesSocket is the kubelet's PodResources socket (Config.Allocations); empty
	// leaves a GPU list under the envvar strategy unchecked.
	PodResourcesSocket string
	// TopologyReload is how often the topology source is read again; a change is applied
	// (the agent republishes the same change) unless running containers hold GPUs the new
	// topology lacks. 0 reads it once.
	TopologyReload time.Duration

	StateFile   string
	MetricsAddr string
	// SocketPath, PluginName and PluginIdx make it an external plugin. When containerd
	// launches the binary from its plugin_path it passes these in the environment instead,
	// and they must stay empty.
	SocketPath string
	PluginName string
	PluginIdx  string
	// Report turns on pod annotations and Events through the API (in-cluster config, or
	// Kubeconfig).
	Report     bool
	Kubeconfig string
	// DaemonSet and Namespace name this pod's DaemonSet, whose uninstall mark turns the
	// plugin pass-through (package lifecycle).
	DaemonSet, Namespace string
	// NodeLabels reads the node's labels for a simulated document that describes the node
	// through a pool; nil: Run sets one that reads them through the API (KubeNodeLabels, one
	// client for every reload, so a failed read falls back to the last labels).
	NodeLabels source.NodeLabels
}

// apiNodeLabels reads the node's labels through the API, with a client made on first use:
// only a pool node of a simulated document needs one.
func apiNodeLabels(o RunOptions) source.NodeLabels {
	var mu sync.Mutex
	var read source.NodeLabels
	return func(ctx context.Context) (map[string]string, error) {
		mu.Lock()
		if read == nil {
			cs, err := kubeClient(o.Kubeconfig)
			if err != nil {
				mu.Unlock()
				return nil, fmt.Errorf("read node %s's labels for the simulated topology's pools: no API access (%v); list the node under the document's nodes instead", o.NodeName, err)
			}
			read = source.KubeNodeLabels(cs, o.NodeName)
		}
		f := read
		mu.Unlock()
		return f(ctx)
	}
}

// LoadTopology reads the node's topology from the configured source.
func LoadTopology(ctx context.Context, o RunOptions) (*topology.Topology, error) {
	if err := o.Topology.Validate(false); err != nil {
		return nil, err
	}
	// A simulated document may describe this node through a pool (a node an autoscaler
	// added): its labels are read then, and only then, through the API.
	labels := o.NodeLabels
	if labels == nil {
		labels = apiNodeLabels(o)
	}
	src, err := o.Topology.Open(o.NodeName, labels)
	if err != nil {
		return nil, err
	}
	top, err := src.Load(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", src.Describe(), err)
	}
	return top, nil
}

// Run connects to containerd's NRI socket and serves until ctx ends, connecting again
// whenever the runtime goes away (serve).
func Run(ctx context.Context, o RunOptions, log logr.Logger) error {
	if err := o.Topology.Validate(false); err != nil {
		return err
	}
	if o.NodeLabels == nil {
		o.NodeLabels = apiNodeLabels(o)
	}
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		return err
	}
	// Probes and metrics serve from the start: while the source yields no topology (NVML not
	// loadable yet) the plugin is up but not ready, and not connected, so containerd refuses
	// the containers that require it: closed, and visible, rather than a crash loop.
	var plugin atomic.Pointer[Plugin]
	if o.MetricsAddr != "" {
		// /readyz fails while the plugin is not connected and synchronized: containerd then
		// refuses every GPU container that requires it, which the pod's readiness shows.
		ready := func() bool { p := plugin.Load(); return p != nil && p.Ready() }
		stop, err := probes.Serve(o.MetricsAddr, reg, ready, "no topology yet, or not connected to the runtime's NRI socket, or not synchronized with it yet")
		if err != nil {
			return err
		}
		defer stop()
	}
	top, err := waitForTopology(ctx, o, retryBackoff, log)
	if err != nil {
		return nil // ctx ended while waiting
	}
	reporters := Reporters{}
	var lastGen int64
	var previous []Assignment
	if o.StateFile != "" {
		// A broken file is replaced by the first snapshot; it must not keep the plugin down.
		if lastGen, err = nristate.LastGeneration(o.StateFile); err != nil {
			log.Error(err, "read the state file's generation; starting from the clock")
		}
		// The holds of exited containers come back from the file only when it describes the
		// same GPUs: after a re-enumeration an index may name another GPU.
		if doc, err := nristate.Read(o.StateFile); err == nil && doc.TopologyFingerprint == top.Fingerprint() {
			previous = doc.Assignments
		}
		var onDrained func()
		if o.HookDir != "" || o.ContainerdConfDir != "" {
			onDrained = func() { removeHostFiles(log, plugin.Load(), o.HookDir, o.ContainerdConfDir) }
		}
		reporters = append(reporters, NewStateFile(ctx, o.StateFile, log.WithName("state"), onDrained))
	}
	var cs kubernetes.Interface
	if o.Report {
		if cs, err = kubeClient(o.Kubeconfig); err != nil {
			return err
		}
		reporters = append(reporters, NewKubeReporter(ctx, cs, o.Names, o.NodeName, log.WithName("report")))
	}
	kind := cdispec.DevicePluginGPU
	if o.CDIKind != "" {
		var ok bool
		if kind, _, ok = cdispec.ParseName(o.CDIKind + "=x"); !ok {
			return fmt.Errorf("--cdi-kind %q: give vendor/class, e.g. %s", o.CDIKind, cdispec.DevicePluginGPU)
		}
	}
	passThrough := false
	if o.HookPath != "" {
		if fi, err := os.Stat(o.HookPath); (err != nil || fi.Mode()&0o111 == 0) && cs != nil && o.DaemonSet != "" {
			// Restarted during an uninstall after the agent removed the hook: serve
			// pass-through, which needs no hook, so pods that require the plugin still start.
			if marked, merr := lifecycle.Marked(ctx, cs, o.Names, o.Namespace, o.DaemonSet); merr == nil && marked {
				log.Info("the release is being uninstalled and the hook is gone: starting in pass-through", "hookPath", o.HookPath)
				o.HookPath, passThrough = "", true
			}
		}
	}
	if o.HookPath != "" {
		if fi, err := os.Stat(o.HookPath); err != nil || fi.Mode()&0o111 == 0 {
			return fmt.Errorf("--hook-path %s: not an executable (%v); install nvdomain-nri-hook on the node there (the chart's install-hook init container does), or pass --hook-path= to leave removed GPUs' device nodes in place, denied by the device cgroup", o.HookPath, err)
		}
	}
	var allocations Allocations
	if o.PodResourcesSocket != "" {
		a, closeFn, err := DialPodResources(o.PodResourcesSocket)
		if err != nil {
			return err
		}
		defer func() { _ = closeFn() }()
		allocations = a
	}
	p, err := New(Config{Names: o.Names, Topology: top, CDIKind: kind, SharedGPUs: o.SharedGPUs, HookPath: o.HookPath, CDISpecDirs: o.CDISpecDirs, DRA: o.DRA,
		DeviceListStrategies: o.DeviceListStrategies, TrustedNamespaces: o.TrustedNamespaces, LastGeneration: lastGen, Previous: previous, Allocations: allocations}, log, m, reporters)
	if err != nil {
		return err
	}
	if passThrough {
		p.SetPassThrough()
	}
	plugin.Store(p)
	ctx, stopServing := context.WithCancelCause(ctx)
	defer stopServing(nil)
	if cs != nil && o.DaemonSet != "" {
		uninstall := lifecycle.WatchUninstall(ctx, cs, o.Names, o.Namespace, o.DaemonSet, log.WithName("lifecycle"))
		go func() {
			select {
			case <-uninstall:
				p.SetPassThrough()
			case <-ctx.Done():
				return
			}
			// Pass-through lasts until this pod goes, unless the release is installed again
			// over the kept DaemonSet: then the plugin restarts as the new release's.
			if lifecycle.WaitUnmarked(ctx, cs, o.Names, o.Namespace, o.DaemonSet, 10*time.Second) {
				stopServing(lifecycle.ErrReinstalled)
			}
		}()
	}
	if o.TopologyReload > 0 {
		go reloadTopology(ctx, o, p, m, log.WithName("topology"))
	}
	var opts []stub.Option
	if o.SocketPath != "" {
		opts = append(opts, stub.WithSocketPath(o.SocketPath))
	}
	if o.PluginName != "" {
		opts = append(opts, stub.WithPluginName(o.PluginName))
	}
	if o.PluginIdx != "" {
		opts = append(opts, stub.WithPluginIdx(o.PluginIdx))
	}
	log.Info("starting", "version", version.Version, "gpus", len(top.GPUs), "domains", len(top.Domains), "source", top.Source, "fingerprint", top.Fingerprint(),
		"cdiKind", kind.String(), "sharedGPUs", o.SharedGPUs, "topologyReload", o.TopologyReload, "hookPath", o.HookPath, "cdiSpecDirs", o.CDISpecDirs, "dra", o.DRA,
		"deviceListStrategies", p.cfg.DeviceListStrategies, "podResourcesSocket", o.PodResourcesSocket, "trustedNamespaces", o.TrustedNamespaces, "lastGeneration", lastGen)
	err = serve(ctx, p, opts, defaultBackoff, log)
	if cause := context.Cause(ctx); errors.Is(cause, lifecycle.ErrReinstalled) {
		return cause
	}
	return err
}

// retryBackoff spaces the attempts to load a first topology.
var retryBackoff = Backoff{Initial: 2 * time.Second, Max: 30 * time.Second}

// waitForTopology loads the node's topology until the source yields one, logging each
// distinct error once (the node agent reads the same source and reports it on the Node as
// the NvdomainTopology condition). It returns an error only when ctx ends.
func waitForTopology(ctx context.Context, o RunOptions, b Backoff, log logr.Logger) (*topology.Topology, error) {
	delay, last := b.Initial, ""
	for {
		top, err := LoadTopology(ctx, o)
		if err == nil {
			return top, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if err.Error() != last {
			last = err.Error()
			log.Error(err, "no topology from the source yet; not connecting to the runtime, so containers that require this plugin are refused; retrying", "retryIn", delay)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(delay):
		}
		delay = min(2*delay, b.Max)
	}
}

// Backoff spaces the attempts to connect to the runtime: Initial after a loss, doubling up to
// Max while attempts fail.
type Backoff struct{ Initial, Max time.Duration }

// defaultBackoff reconnects fast: while the plugin is away, containerd refuses every GPU
// container that requires it.
var defaultBackoff = Backoff{Initial: 200 * time.Millisecond, Max: 5 * time.Second}

// serve connects to the runtime and serves until ctx ends. The stub's Run returns when the
// connection goes away (containerd restarted, or was not up yet); exiting then would put the
// DaemonSet's pod into CrashLoopBackOff, whose growing delays keep GPU containers refused long
// after containerd is back, so serve connects again in-process, with a fresh stub each time.
// The books stay in memory meanwhile, and the runtime's Synchronize on the new connection
// replaces them with what runs.
//
// A plugin containerd launched itself (pre-installed, NRI_PLUGIN_SOCKET set) got one end of a
// socket pair it cannot dial again; containerd starts a new process when it restarts, so that
// one exits.
func serve(ctx context.Context, p *Plugin, opts []stub.Option, b Backoff, log logr.Logger) error {
	if os.Getenv(api.PluginSocketEnvVar) != "" {
		s, err := stub.New(p, opts...)
		if err != nil {
			return fmt.Errorf("create NRI stub: %w", err)
		}
		setSelf(p, s)
		err = s.Run(ctx)
		p.disconnected()
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("NRI connection from containerd closed: %w", err)
	}
	delay := b.Initial
	for {
		s, err := stub.New(p, append(opts, stub.WithOnClose(p.disconnected))...)
		if err != nil {
			return fmt.Errorf("create NRI stub: %w", err)
		}
		setSelf(p, s)
		syncs := p.syncs.Load()
		err = s.Run(ctx)
		p.disconnected()
		if ctx.Err() != nil {
			return nil
		}
		if p.syncs.Load() != syncs {
			// It was connected and synchronized: the runtime went away, so try at once-ish
			// and back off only while it stays away.
			delay = b.Initial
			p.metrics.Reconnects.Inc()
		}
		log.Error(err, "not connected to the runtime's NRI socket; connecting again", "in", delay)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
		delay = min(2*delay, b.Max)
	}
}

// reloadTopology reads the topology source every o.TopologyReload and applies a change, so the
// plugin follows the agent (which republishes the same source) instead of silently serving
// an old topology; a change it cannot apply is logged and counted, and the agent shows the
// mismatch on the node (the fingerprints in the state file differ).
func reloadTopology(ctx context.Context, o RunOptions, p *Plugin, m *Metrics, log logr.Logger) {
	t := time.NewTicker(o.TopologyReload)
	defer t.Stop()
	lastErr := ""
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		top, err := LoadTopology(ctx, o)
		if err != nil {
			if err.Error() != lastErr {
				log.Error(err, "reload the topology; keeping the one in use")
				lastErr = err.Error()
			}
			m.TopologyReloads.WithLabelValues("error").Inc()
			continue
		}
		lastErr = ""
		if top.Fingerprint() == p.Topology().Fingerprint() {
			continue
		}
		if err := p.SetTopology(top); err != nil {
			log.Error(err, "topology changed but cannot be applied yet", "fingerprint", top.Fingerprint())
			m.TopologyReloads.WithLabelValues("refused").Inc()
			continue
		}
		log.Info("topology changed; applied", "fingerprint", top.Fingerprint(), "domains", len(top.Domains))
		m.TopologyReloads.WithLabelValues("applied").Inc()
		p.republish()
	}
}

func kubeClient(kubeconfig string) (kubernetes.Interface, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client for pod reports: %w (run with --report=false to skip them)", err)
	}
	return kubernetes.NewForConfig(cfg)
}

// setSelf tells the plugin the name the runtime knows it by (index-name), which the stub
// has but its interface does not export.
func setSelf(p *Plugin, s stub.Stub) {
	if n, ok := s.(interface{ Name() string }); ok {
		p.SetSelf(n.Name())
	}
	f := s.RuntimeNRIVersion
	p.runtimeNRI.Store(&f)
}

// removeHostFiles ends an uninstall on this node: no pod requires the plugin any more, so the
// hook and containerd's NRI snippet leave the host (hostfiles.Remove). The plugin stops naming
// the hook first, so no container created meanwhile is given a hook that is gone.
func removeHostFiles(log logr.Logger, p *Plugin, hookDir, confDir string) {
	if p != nil {
		p.DropHook()
	}
	removed, err := hostfiles.Remove(hookDir, confDir)
	if err != nil {
		log.Error(err, "remove nvdomain's files from the host at the end of the uninstall")
	}
	log.Info("no pod here requires the plugin: host files removed", "paths", removed)
}

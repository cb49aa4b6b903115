package fleet

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"

	"github.com/nvdomain/nvdomain/pkg/agent"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/probes"
	"github.com/nvdomain/nvdomain/pkg/topology/simulated"
)

// Options configure nvdomain-fleet.
type Options struct {
	Names names.Names
	// SimulatedFile is the document on disk; without it, ConfigMap (namespace/name) is
	// watched.
	SimulatedFile string
	ConfigMap     string
	Period        time.Duration
	ProbeAddr     string
	Kubeconfig    string
	// KubeAPIQPS and KubeAPIBurst bound the process's requests: a thousand nodes' publishes
	// need far more than one agent's.
	KubeAPIQPS   float64
	KubeAPIBurst int
}

// AddFlags registers the options on fs.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.SimulatedFile, "simulated-file", "", "simulated-topology document on disk")
	fs.StringVar(&o.ConfigMap, "configmap", "nvdomain-system/nvdomain-topology", "namespace/name of the simulated-topology ConfigMap, when no --simulated-file is given")
	fs.DurationVar(&o.Period, "period", 30*time.Second, "how often everything is re-asserted")
	fs.StringVar(&o.ProbeAddr, "probe-bind-address", ":8082", "address for /healthz, /readyz and /metrics; empty disables")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig; empty means in-cluster")
	fs.Float64Var(&o.KubeAPIQPS, "kube-api-qps", 100, "requests per second to the apiserver")
	fs.IntVar(&o.KubeAPIBurst, "kube-api-burst", 200, "request burst to the apiserver")
}

// Validate checks the options and names the flag at fault.
func (o Options) Validate() error {
	switch {
	case o.Period <= 0:
		return fmt.Errorf("--period=%s: must be positive", o.Period)
	case o.KubeAPIQPS <= 0 || o.KubeAPIBurst <= 0:
		return errors.New("--kube-api-qps and --kube-api-burst must be positive")
	case o.SimulatedFile == "" && !strings.Contains(strings.Trim(o.ConfigMap, "/"), "/"):
		return fmt.Errorf("--configmap %q: give namespace/name, e.g. nvdomain-system/nvdomain-topology", o.ConfigMap)
	}
	return nil
}

// Run publishes every node of the simulated document from this process until ctx ends.
func Run(ctx context.Context, o Options, log logr.Logger) error {
	if err := o.Validate(); err != nil {
		return err
	}
	cfg, err := agent.RestConfig(o.Kubeconfig, float32(o.KubeAPIQPS), o.KubeAPIBurst)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}
	p, err := simulated.NewParser()
	if err != nil {
		return err
	}
	var doc DocumentSource
	if o.SimulatedFile != "" {
		doc = &DocumentFile{Path: o.SimulatedFile, Parser: p}
	} else {
		ns, name, _ := strings.Cut(o.ConfigMap, "/")
		if doc, err = agent.NewConfigMapSource(ctx, client, ns, name, "", p); err != nil {
			return err
		}
	}
	reg := prometheus.NewRegistry()
	m, err := NewFleetMetrics(reg)
	if err != nil {
		return err
	}
	f := &Fleet{Names: o.Names, Doc: doc, Client: client, Period: o.Period, Log: log, Metrics: m}
	if o.ProbeAddr != "" {
		stop, err := probes.Serve(o.ProbeAddr, reg, f.Ready, "not every node of the simulated topology is published yet")
		if err != nil {
			return err
		}
		defer stop()
	}
	log.Info("starting for every node of the simulated topology", "source", doc.Describe(), "period", o.Period, "qps", o.KubeAPIQPS, "burst", o.KubeAPIBurst)
	return f.Run(ctx)
}

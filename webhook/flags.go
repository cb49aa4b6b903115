package webhook

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/webhook/repin"
)

// DefaultServerOptions are the documented defaults of the webhook process.
func DefaultServerOptions() ServerOptions {
	return ServerOptions{
		Handlers:                DefaultOptions(),
		CertDir:                 "/etc/nvdomain/tls",
		Port:                    9443,
		MetricsAddr:             ":8080",
		ProbeAddr:               ":8081",
		Repin:                   repin.DefaultOptions(),
		LeaderElection:          true,
		LeaderElectionID:        "nvdomain-repin",
		LeaderElectionNamespace: os.Getenv("POD_NAMESPACE"),
	}
}

// AddFlags registers every flag of the webhook process on fs and returns the function that
// turns the parsed strings into options and validates them, naming the flag at fault.
func (so *ServerOptions) AddFlags(fs *flag.FlagSet) (complete func() error) {
	fs.StringVar(&so.CertDir, "cert-dir", so.CertDir, "directory with tls.crt and tls.key (watched for rotation)")
	fs.StringVar(&so.Host, "host", so.Host, "address to serve the webhook on (empty: all interfaces)")
	fs.IntVar(&so.Port, "port", so.Port, "webhook port")
	fs.StringVar(&so.MetricsAddr, "metrics-bind-address", so.MetricsAddr, "Prometheus metrics address; 0 disables")
	fs.StringVar(&so.ProbeAddr, "health-probe-bind-address", so.ProbeAddr, "healthz/readyz address")
	tpSizes := fs.String("tp-sizes", "2,4,8,16,32,64,128,256", "allowed tensor-parallel sizes")
	nonTP := fs.String("non-tp-pods", string(so.Handlers.NonTPPods), "what to do with GPU pods that are not tensor-parallel: pin, account or auto")
	mode := fs.String("mode", string(so.Handlers.Mode), "which node pools TP pods go to: classic (pin to a domain id), dra (rewrite onto the ResourceClaimTemplate nvdomain-tp-<k>; DRA pools only) or mixed (DRA for pods that select only nodes labelled nvdomain-mode=dra, classic for the rest); docs/dra.md")
	so.DRATemplates.AddFlags(fs)
	excluded := fs.String("exclude-namespaces", strings.Join(so.Handlers.ExcludedNamespaces, ","), "comma-separated namespaces never touched (add the webhook's own)")
	fs.BoolVar(&so.LeaderElection, "leader-elect", so.LeaderElection, "elect one replica to run the re-pin and template controllers (every replica serves admissions)")
	fs.StringVar(&so.LeaderElectionNamespace, "leader-election-namespace", so.LeaderElectionNamespace, "namespace of the leader-election Lease (default $POD_NAMESPACE)")
	so.Repin.AddFlags(fs)
	namesFromFlags := names.BindFlags(fs)
	return func() error {
		var err error
		if so.Handlers.AllowedTPSizes, err = ParseTPSizes(*tpSizes); err != nil {
			return fmt.Errorf("--tp-sizes: %w", err)
		}
		if so.Handlers.NonTPPods, err = ParseNonTPMode(*nonTP); err != nil {
			return fmt.Errorf("--non-tp-pods: %w", err)
		}
		if so.Handlers.Mode, err = ParseMode(*mode); err != nil {
			return fmt.Errorf("--mode: %w", err)
		}
		if so.Handlers.Names, err = namesFromFlags(); err != nil {
			return err
		}
		so.Handlers.ExcludedNamespaces = nil
		for _, ns := range strings.Split(*excluded, ",") {
			if ns = strings.TrimSpace(ns); ns != "" {
				so.Handlers.ExcludedNamespaces = append(so.Handlers.ExcludedNamespaces, ns)
			}
		}
		return so.Validate()
	}
}

// Validate checks what the flags cannot check one by one.
func (so ServerOptions) Validate() error {
	if so.Port <= 0 || so.Port > 65535 {
		return fmt.Errorf("--port=%d: must be a TCP port", so.Port)
	}
	if so.Repin.Enabled {
		if err := so.Repin.Validate(); err != nil {
			return err
		}
	}
	if so.leaderOnly() && so.LeaderElection && so.LeaderElectionNamespace == "" {
		return fmt.Errorf("--leader-election-namespace is empty: set it (or POD_NAMESPACE) to the webhook's namespace, or pass --leader-elect=false when only one replica runs")
	}
	return nil
}

// Summary is the effective configuration, logged once at start.
func (so ServerOptions) Summary() map[string]any {
	return map[string]any{
		"port": so.Port, "nonTPPods": so.Handlers.NonTPPods, "tpSizes": so.Handlers.AllowedTPSizes,
		"excludedNamespaces": so.Handlers.ExcludedNamespaces, "labelPrefix": so.Handlers.Names.LabelPrefix(),
		"resourcePrefix": so.Handlers.Names.ResourcePrefix(), "repin": so.Repin.Enabled, "repinAfter": so.Repin.After.String(),
		"leaderElection": so.LeaderElection, "leaderElectionNamespace": so.LeaderElectionNamespace,
		"mode": so.Handlers.Mode, "draTemplates": so.DRATemplates.Enabled,
	}
}

package webhook

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	decision "github.com/nvdomain/nvdomain/pkg/admission"
	"github.com/nvdomain/nvdomain/pkg/clusterview"
	"github.com/nvdomain/nvdomain/pkg/names"
	prepin "github.com/nvdomain/nvdomain/pkg/repin"
	"github.com/nvdomain/nvdomain/webhook/dratemplates"
	"github.com/nvdomain/nvdomain/webhook/imex"
	"github.com/nvdomain/nvdomain/webhook/reservations"
)

// DefaultServerOptions are the documented defaults of the webhook process.
func DefaultServerOptions() ServerOptions {
	return ServerOptions{
		Handlers:                decision.DefaultOptions(),
		CertDir:                 "/etc/nvdomain/tls",
		Port:                    9443,
		MetricsAddr:             ":8080",
		ProbeAddr:               ":8081",
		Repin:                   prepin.DefaultOptions(),
		LeaderElection:          true,
		LeaderElectionID:        "nvdomain-repin",
		LeaderElectionNamespace: os.Getenv("POD_NAMESPACE"),
		Drain:                   &Drain{},
		ShutdownDelay:           10 * time.Second,
		Replicas:                1,
		UnschedulableHold:       clusterview.UnschedulableHold,
		KueueWatch:              true,
		IMEXChannels:            true,
		IMEXRecheck:             imex.DefaultRecheck,
		// The chart sets these through the environment, which an older image ignores.
		DRATemplates:    dratemplates.Options{Reservations: os.Getenv("NVDOMAIN_DRA_RESERVATIONS") == "true"},
		DRAReservations: reservations.Options{Namespace: os.Getenv("POD_NAMESPACE"), TTL: envDuration("NVDOMAIN_DRA_RESERVATION_TTL", reservations.DefaultTTL), Interval: reservations.DefaultInterval},
		CertRotation: CertRotationOptions{
			Validity:    365 * 24 * time.Hour,
			RenewBefore: 30 * 24 * time.Hour,
			Interval:    time.Hour,
		},
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
	fs.StringVar(&so.PprofAddr, "pprof-bind-address", so.PprofAddr, "serve Go's pprof profiles (/debug/pprof/) on this address; empty disables (keep it off networks others reach)")
	tpSizes := fs.String("tp-sizes", "2,4,8,16,32,64,128,256", "allowed tensor-parallel sizes")
	nonTP := fs.String("non-tp-pods", string(so.Handlers.NonTPPods), "what to do with GPU pods that are not tensor-parallel: pin, account or auto")
	mode := fs.String("mode", string(so.Handlers.Mode), "which node pools TP pods go to: classic (pin to a domain id), dra (rewrite onto the ResourceClaimTemplate nvdomain-tp-<k>; DRA pools only) or mixed (DRA for pods that select only nodes labelled nvdomain-mode=dra, classic for the rest); docs/dra.md")
	groups := fs.String("group-placement", string(so.Handlers.GroupPlacement), "how a LeaderWorkerSet group is kept in one multi-node NVLink clique: pin (required node affinity on the clique label, chosen at the leader's admission; any release) or workload (a Workload API PodGroup with gang minCount and a topology constraint on the clique label, placed by the scheduler; Kubernetes 1.37 with the GenericWorkload and TopologyAwareWorkloadScheduling gates, else the webhook pins and logs why); docs/multinode.md")
	so.DRATemplates.AddFlags(fs)
	so.DRAReservations.AddFlags(fs)
	excluded := fs.String("exclude-namespaces", strings.Join(so.Handlers.ExcludedNamespaces, ","), "comma-separated namespaces never touched (add the webhook's own)")
	fs.DurationVar(&so.UnschedulableHold, "unschedulable-hold", so.UnschedulableHold, "how long a pending pod that the scheduler rejects for reasons other than GPUs (pod affinity, CPU, volumes) keeps the GPU room it is pinned to; after it, that room counts free for other pods (docs/architecture.md)")
	fs.IntVar(&so.Replicas, "replicas", so.Replicas, "how many webhook replicas admit pods (the chart passes the Deployment's replicas): each keeps its own reservations and enforces its share of the per-namespace reservation caps, so all of them together hold no more than one namespace's caps")
	fs.DurationVar(&so.ShutdownDelay, "shutdown-delay", so.ShutdownDelay, "after SIGTERM, how long to keep serving with readiness failing, so the Service's endpoints drop this replica before it closes (keep it under the pod's terminationGracePeriodSeconds)")
	fs.BoolVar(&so.LeaderElection, "leader-elect", so.LeaderElection, "elect one replica to run the re-pin and template controllers (every replica serves admissions)")
	fs.StringVar(&so.LeaderElectionID, "leader-election-id", so.LeaderElectionID, "name of the leader-election Lease; give each release in a namespace its own (the chart uses <release>-repin)")
	fs.StringVar(&so.LeaderElectionNamespace, "leader-election-namespace", so.LeaderElectionNamespace, "namespace of the leader-election Lease (default $POD_NAMESPACE)")
	so.Repin.AddFlags(fs)
	fs.BoolVar(&so.IMEXChannels, "imex-channels", so.IMEXChannels, "while NVIDIA's ComputeDomain API ("+names.ComputeDomainResource+"."+names.ComputeDomainGroup+") is served, give the pods of a LeaderWorkerSet group pinned to an NVLink clique an IMEX channel from a ComputeDomain the elected replica makes for the LeaderWorkerSet; when it is not served, warn at admission")
	fs.DurationVar(&so.IMEXRecheck, "imex-recheck", so.IMEXRecheck, "how often each replica asks discovery whether NVIDIA's ComputeDomain API is served (--imex-channels)")
	fs.BoolVar(&so.KueueWatch, "kueue-watch", so.KueueWatch, "on the elected replica, follow Kueue's Workloads (kueue.x-k8s.io/"+names.KueueWorkloadVersion+", once Kueue is installed) and record a Warning on each one Kueue holds back because its ClusterQueue does not cover nvdomain's per-domain resource, naming the Kueue setting that fixes it")
	cr := &so.CertRotation
	fs.StringVar(&cr.Secret, "cert-secret", cr.Secret, "namespace/name of the Secret the elected replica fills with a self-signed CA and serving certificate at run time, and renews; every replica then serves from it, not from --cert-dir (empty: certificates are managed elsewhere, e.g. cert-manager, and read from --cert-dir)")
	fs.StringVar(&cr.WebhookConfiguration, "webhook-configuration", cr.WebhookConfiguration, "name of the Mutating- and ValidatingWebhookConfiguration whose caBundle follows the Secret's CAs")
	fs.StringVar(&cr.Service, "cert-service", cr.Service, "the webhook Service's name, for the certificate's DNS names")
	certHosts := fs.String("cert-hosts", "", "comma-separated extra DNS names or IPs for the certificate (e.g. 127.0.0.1 when the webhook is reached by URL)")
	fs.DurationVar(&cr.Validity, "cert-validity", cr.Validity, "validity of a renewed serving certificate (the CA lives ten times longer)")
	fs.DurationVar(&cr.RenewBefore, "cert-renew-before", cr.RenewBefore, "renew the serving certificate this long before it expires")
	fs.DurationVar(&cr.Interval, "cert-check-interval", cr.Interval, "how often the elected replica checks the certificate")
	pools := fs.String("pools-configmap", "", "namespace/name of the ConfigMap whose topology.json declares GPU pools that scale from zero (docs/pools.md); empty: none")
	poolsSum := fs.String("pools-checksum", "", "SHA-256 (hex) of the topology.json the release wrote into --pools-configmap: the replica is not ready while that version does not parse and it has no earlier one; a version edited by hand never makes it unready")
	namesFromFlags := names.BindFlags(fs)
	return func() error {
		var err error
		if so.Handlers.AllowedTPSizes, err = decision.ParseTPSizes(*tpSizes); err != nil {
			return fmt.Errorf("--tp-sizes: %w", err)
		}
		if so.Handlers.NonTPPods, err = decision.ParseNonTPMode(*nonTP); err != nil {
			return fmt.Errorf("--non-tp-pods: %w", err)
		}
		if so.Handlers.GroupPlacement, err = decision.ParseGroupPlacement(*groups); err != nil {
			return fmt.Errorf("--group-placement: %w", err)
		}
		if so.Handlers.Mode, err = decision.ParseMode(*mode); err != nil {
			return fmt.Errorf("--mode: %w", err)
		}
		if so.Pools, err = ParsePoolsConfigMap(*pools); err != nil {
			return fmt.Errorf("--pools-configmap: %w", err)
		}
		so.Pools.Checksum = *poolsSum
		if so.Handlers.Names, err = namesFromFlags(); err != nil {
			return err
		}
		for _, h := range strings.Split(*certHosts, ",") {
			if h = strings.TrimSpace(h); h != "" {
				cr.Hosts = append(cr.Hosts, h)
			}
		}
		so.Handlers.ExcludedNamespaces = nil
		for _, ns := range strings.Split(*excluded, ",") {
			if ns = strings.TrimSpace(ns); ns != "" {
				so.Handlers.ExcludedNamespaces = append(so.Handlers.ExcludedNamespaces, ns)
			}
		}
		if v := os.Getenv("NVDOMAIN_DRA_RESERVATION_TTL"); v != "" {
			if _, err := time.ParseDuration(v); err != nil {
				return fmt.Errorf("$NVDOMAIN_DRA_RESERVATION_TTL=%q (the chart's dra.reservationTTL): %w; give a duration such as 5m", v, err)
			}
		}
		if so.DRAReservations.Namespace == "" {
			// The release's namespace, as the Lease's.
			so.DRAReservations.Namespace = so.LeaderElectionNamespace
		}
		return so.Validate()
	}
}

// Validate checks what the flags cannot check one by one.
func (so ServerOptions) Validate() error {
	if so.Port <= 0 || so.Port > 65535 {
		return fmt.Errorf("--port=%d: must be a TCP port", so.Port)
	}
	if so.IMEXChannels && so.IMEXRecheck <= 0 {
		return fmt.Errorf("--imex-recheck=%s: must be positive (default %s)", so.IMEXRecheck, imex.DefaultRecheck)
	}
	if so.UnschedulableHold <= 0 {
		return fmt.Errorf("--unschedulable-hold=%s: must be positive", so.UnschedulableHold)
	}
	if so.Replicas < 1 {
		return fmt.Errorf("--replicas=%d: give the number of webhook replicas, at least 1", so.Replicas)
	}
	if so.ShutdownDelay < 0 {
		return fmt.Errorf("--shutdown-delay=%s: must not be negative", so.ShutdownDelay)
	}
	if cr := so.CertRotation; cr.Secret != "" {
		if ns, name, ok := strings.Cut(cr.Secret, "/"); !ok || ns == "" || name == "" {
			return fmt.Errorf("--cert-secret=%q: give namespace/name, e.g. nvdomain-system/nvdomain-webhook-certificates", cr.Secret)
		}
		switch {
		case cr.Service == "" && len(cr.Hosts) == 0:
			return fmt.Errorf("--cert-secret needs --cert-service (or --cert-hosts) to know whom the certificate is for")
		case cr.Validity <= 0 || cr.RenewBefore <= 0 || cr.RenewBefore >= cr.Validity:
			return fmt.Errorf("--cert-renew-before=%s must be positive and shorter than --cert-validity=%s", cr.RenewBefore, cr.Validity)
		case cr.Interval <= 0 || cr.Interval >= cr.RenewBefore:
			return fmt.Errorf("--cert-check-interval=%s must be positive and shorter than --cert-renew-before=%s, or a renewal could be missed", cr.Interval, cr.RenewBefore)
		}
		if so.LeaderElection && so.LeaderElectionNamespace == "" {
			return fmt.Errorf("--leader-election-namespace is empty: set it (or POD_NAMESPACE) to the webhook's namespace")
		}
	}
	if so.DRATemplates.Enabled && so.DRATemplates.Reservations {
		if err := so.DRAReservations.Validate(); err != nil {
			return err
		}
		if so.DRAReservations.Namespace == "" {
			return fmt.Errorf("--dra-reservations needs the webhook's namespace for the ConfigMap %s: set POD_NAMESPACE (the chart does)", names.DRAReservationsConfigMap)
		}
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
		"leaderElection": so.LeaderElection, "leaderElectionNamespace": so.LeaderElectionNamespace, "shutdownDelay": so.ShutdownDelay.String(),
		"certSecret": so.CertRotation.Secret, "certValidity": so.CertRotation.Validity.String(), "certRenewBefore": so.CertRotation.RenewBefore.String(),
		"mode": so.Handlers.Mode, "draTemplates": so.DRATemplates.Enabled, "draReservations": so.DRATemplates.Enabled && so.DRATemplates.Reservations, "pools": so.Pools.Namespace + "/" + so.Pools.Name, "kueueWatch": so.KueueWatch, "imexChannels": so.IMEXChannels, "groupPlacement": so.Handlers.GroupPlacement,
	}
}

// envDuration is the duration in the environment variable, or def when it is unset; one that
// does not parse gives 0, which validation refuses with the flag's name.
func envDuration(name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0
	}
	return d
}

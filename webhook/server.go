package webhook

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	decision "github.com/nvdomain/nvdomain/pkg/admission"
	"github.com/nvdomain/nvdomain/pkg/certs"
	"github.com/nvdomain/nvdomain/pkg/clusterview"
	prepin "github.com/nvdomain/nvdomain/pkg/repin"
	"github.com/nvdomain/nvdomain/webhook/certrotation"
	"github.com/nvdomain/nvdomain/webhook/dratemplates"
	"github.com/nvdomain/nvdomain/webhook/imex"
	"github.com/nvdomain/nvdomain/webhook/kueuewatch"
	"github.com/nvdomain/nvdomain/webhook/podgroups"
	"github.com/nvdomain/nvdomain/webhook/repin"
	"github.com/nvdomain/nvdomain/webhook/reservations"
)

// Paths the handlers serve; the webhook configurations in manifests/ point at them.
const (
	MutatePath   = "/mutate-pods"
	ValidatePath = "/validate-pods"
)

// ServerOptions configure the process around the handlers.
type ServerOptions struct {
	Handlers decision.Options
	// CertDir holds tls.crt and tls.key; it is watched, so rotated certificates are picked
	// up without a restart. Unused when CertRotation.Secret is set: then every replica
	// serves the certificate straight from that Secret.
	CertDir     string
	Host        string
	Port        int
	MetricsAddr string
	ProbeAddr   string
	// Registry receives the metrics; nil means controller-runtime's registry, which the
	// metrics endpoint serves.
	Registry ctrlmetrics.RegistererGatherer
	// Repin configures the re-pin controller, which runs on the elected leader only while
	// every replica serves admissions.
	Repin prepin.Options
	// LeaderElection elects the replica that runs the re-pin controller, through a Lease
	// named LeaderElectionID in LeaderElectionNamespace.
	LeaderElection          bool
	LeaderElectionID        string
	LeaderElectionNamespace string
	// Drain fails readiness while the process shuts down (RunGracefully); ShutdownDelay is how
	// long it keeps serving after that.
	Drain         *Drain
	ShutdownDelay time.Duration
	// Replicas is how many webhook replicas admit pods: each enforces its share of the
	// per-namespace reservation caps (clusterview.View.SetReplicas).
	Replicas int
	// UnschedulableHold: clusterview.View.SetUnschedulableHold.
	UnschedulableHold time.Duration
	// CertRotation, when CertRotation.Secret is set, makes and renews the self-signed
	// serving certificate in that Secret on the elected replica, and every replica serves it
	// from there (package certrotation).
	CertRotation CertRotationOptions
	// DRATemplates configures the controller that keeps the ResourceClaimTemplates of DRA
	// mode in every namespace; it runs on the elected leader too. Its sizes and excluded
	// namespaces are the handlers'.
	DRATemplates dratemplates.Options
	// DRAReservations times the reservation controller, which runs with DRATemplates'
	// Reservations (webhook/reservations).
	DRAReservations reservations.Options
	// KueueWatch follows Kueue's Workloads on the elected leader and warns on those Kueue
	// holds back for nvdomain's per-domain resource (package kueuewatch); it waits for
	// Kueue's API when Kueue is not installed.
	KueueWatch bool
	// IMEXChannels gives LeaderWorkerSet groups pinned to a clique an IMEX channel from a
	// ComputeDomain of NVIDIA's, while that API is served (package imex): every replica
	// watches discovery, the elected one makes the ComputeDomains.
	IMEXChannels bool
	// IMEXRecheck is how often every replica asks discovery whether the ComputeDomain API
	// is served.
	IMEXRecheck time.Duration
	// Pools names the ConfigMap that declares GPU pools that scale from zero (docs/pools.md);
	// empty: none.
	Pools PoolsConfigMap
	// PprofAddr serves net/http/pprof there; empty disables it.
	PprofAddr string
	// AdmissionOverride, when set, answers on every webhook path instead of nvdomain's
	// handlers, and everything else about the process stays as it is: test/noopwebhook sets
	// it to a handler that allows everything, the baseline against which
	// docs/benchmarks.md measures what nvdomain's admission costs.
	AdmissionOverride admission.Handler
}

// CertRotationOptions configure the self-signed certificate rotator.
type CertRotationOptions struct {
	// Secret is namespace/name of the serving certificate's Secret; empty disables rotation.
	Secret string
	// WebhookConfiguration names the webhook configurations whose caBundle it keeps.
	WebhookConfiguration string
	// Service is the webhook Service's name (its namespace is the Secret's); Hosts are extra
	// names or IPs the certificate must cover.
	Service     string
	Hosts       []string
	Validity    time.Duration
	RenewBefore time.Duration
	Interval    time.Duration
}

// leaderOnly reports whether a controller that must run on one replica is on.
func (so ServerOptions) leaderOnly() bool {
	return so.Repin.Enabled || so.DRATemplates.Enabled || so.CertRotation.Secret != "" || so.KueueWatch || so.IMEXChannels ||
		so.Handlers.GroupPlacement == decision.GroupWorkload
}

// NewManager builds a controller-runtime manager serving the webhook, with the informers that
// feed the cluster view. Start it with mgr.Start.
func NewManager(cfg *rest.Config, so ServerOptions, log logr.Logger) (manager.Manager, *clusterview.View, error) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, nil, err
	}
	reg := so.Registry
	if reg == nil {
		reg = ctrlmetrics.Registry
	}
	byObject := map[client.Object]cache.ByObject{
		&corev1.Pod{}:  {Transform: clusterview.StripPod(so.Handlers.Names)},
		&corev1.Node{}: {Transform: clusterview.StripNode(so.Handlers.Names)},
	}
	// In DRA and mixed mode the view follows the GPUs ResourceClaims hold on DRA nodes, for
	// the scheduling hint (clusterview.DRAHint). Classic mode does not watch claims, so it
	// runs on clusters that do not serve resource.k8s.io.
	watchClaims := so.Handlers.Mode != decision.ModeClassic
	if watchClaims {
		byObject[&resourceapi.ResourceClaim{}] = cache.ByObject{Transform: clusterview.StripClaim}
	}
	if so.Repin.Enabled {
		// The re-pin controller walks a stranded pod's owners up to the top-level one through
		// metadata-only informers, started on its first read and stripped to what it reads.
		maps.Copy(byObject, prepin.OwnerCache())
	}
	so.Pools.WatchPools(byObject)
	// In self-signed mode every replica serves the certificate straight from its Secret (the
	// elected replica makes it at run time; certrotation.Source says why not from the mount).
	var source *certrotation.Source
	tlsOpts := []func(*tls.Config){func(c *tls.Config) { c.MinVersion = tls.VersionTLS12 }}
	var certClients kubernetes.Interface
	if cr := so.CertRotation; cr.Secret != "" {
		ns, name, _ := strings.Cut(cr.Secret, "/")
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return nil, nil, fmt.Errorf("certificate client: %w", err)
		}
		certClients = cs
		source = &certrotation.Source{Clientset: certClients, Secret: types.NamespacedName{Namespace: ns, Name: name}, Log: log.WithName("certificates")}
		tlsOpts = append(tlsOpts, func(c *tls.Config) { c.GetCertificate = source.GetCertificate })
	}
	mgr, err := manager.New(cfg, manager.Options{
		Scheme: scheme,
		Logger: log,
		Cache:  cache.Options{ByObject: byObject},
		WebhookServer: crwebhook.NewServer(crwebhook.Options{
			Host:    so.Host,
			Port:    so.Port,
			CertDir: so.CertDir,
			TLSOpts: tlsOpts,
		}),
		Metrics:                metricsserver.Options{BindAddress: so.MetricsAddr},
		HealthProbeBindAddress: so.ProbeAddr,
		PprofBindAddress:       so.PprofAddr,
		LeaderElection:         so.LeaderElection && so.leaderOnly(),
		LeaderElectionID:       so.LeaderElectionID,
		// The Lease is handed over at once on a clean shutdown, so a rolling update does not
		// leave re-pinning idle for a lease duration.
		LeaderElectionNamespace:       so.LeaderElectionNamespace,
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("create manager: %w", err)
	}
	view := clusterview.New(so.Handlers.Names)
	view.SetDRABlocks(so.DRATemplates.Blocks)
	view.SetReplicas(so.Replicas)
	if so.UnschedulableHold > 0 { // zero: options built without DefaultServerOptions
		view.SetUnschedulableHold(so.UnschedulableHold)
	}
	synced, err := feedView(mgr.GetCache(), view, watchClaims)
	if err != nil {
		return nil, nil, err
	}
	var pools *poolsFeed
	if so.Pools.Name != "" {
		pm, err := NewPoolMetrics(reg)
		if err != nil {
			return nil, nil, err
		}
		pf, err := newPoolsFeed(so.Pools, view, so.Handlers.Names, pm, log.WithName("pools"))
		if err != nil {
			return nil, nil, err
		}
		preg, err := pf.feed(mgr.GetCache())
		if err != nil {
			return nil, nil, err
		}
		// Ready only once the pools are known too: a replica that had not read them would
		// reject the pods that wait for a pool as impossible.
		synced = append(synced, preg)
		pools = pf
	}
	metrics, err := NewMetrics(reg)
	if err != nil {
		return nil, nil, fmt.Errorf("register metrics: %w", err)
	}
	if so.Handlers.GroupPlacement == decision.GroupWorkload {
		// Checked once, at start: the feature gates and runtime-config of the control plane
		// change only with a restart of the apiserver, and the webhook replicas roll with an
		// upgrade anyway. Where the cluster cannot do it, groups are pinned: a TP group is
		// never left without a clique.
		ok, reason, err := checkPodGroups(cfg, so.LeaderElectionNamespace, log)
		if err != nil {
			// No answer either way: a replica that guessed "pin" beside replicas that use
			// PodGroups would be harmless (workers follow their leader), but one that
			// guessed "workload" on a cluster without the gates would leave groups unplaced.
			// The Deployment starts it again.
			return nil, nil, fmt.Errorf("--group-placement=workload: %w", err)
		}
		if !ok {
			log.Error(nil, "--group-placement=workload cannot be used on this cluster; LeaderWorkerSet groups are pinned to a clique instead (--group-placement=pin)", "reason", reason)
			so.Handlers.GroupPlacement = decision.GroupPin
		} else {
			log.Info("LeaderWorkerSet groups are placed through Workload API PodGroups (gang, topology on the clique label)", "api", podgroups.GVR.GroupVersion().String())
		}
		// On every replica asked for it, whatever its own check said: the elected replica
		// must make the PodGroups the other replicas' pods name. It does nothing for pods no
		// replica put in a PodGroup.
		r := &podgroups.Reconciler{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Names: so.Handlers.Names,
			Recorder: mgr.GetEventRecorder("nvdomain-podgroups"), Log: log.WithName("podgroups")}
		if err := r.Setup(mgr); err != nil {
			return nil, nil, fmt.Errorf("PodGroup controller: %w", err)
		}
	}
	mut, val := NewHandlers(view, so.Handlers, metrics, log)
	if so.Handlers.GroupPlacement == decision.GroupWorkload {
		mut.LWS = podgroups.LWSReader{Reader: mgr.GetAPIReader()}
	}
	if source == nil {
		if err := certrotation.RegisterServedExpiry(reg, filepath.Join(so.CertDir, certs.CertFile)); err != nil {
			return nil, nil, err
		}
	} else {
		if err := source.RegisterExpiry(reg); err != nil {
			return nil, nil, err
		}
		if err := mgr.Add(source); err != nil {
			return nil, nil, fmt.Errorf("certificate source: %w", err)
		}
		if err := mgr.AddReadyzCheck("serving-certificate", source.Ready); err != nil {
			return nil, nil, fmt.Errorf("readiness check: %w", err)
		}
	}
	if cr := so.CertRotation; cr.Secret != "" {
		ns, name, _ := strings.Cut(cr.Secret, "/")
		// Secrets and webhook configurations are read directly, not through the informer
		// cache, which would list every Secret in the cluster.
		direct, err := client.New(cfg, client.Options{Scheme: scheme})
		if err != nil {
			return nil, nil, fmt.Errorf("certificate rotation client: %w", err)
		}
		cm, err := certrotation.NewMetrics(reg)
		if err != nil {
			return nil, nil, err
		}
		rot := &certrotation.Rotator{Client: direct, Secret: types.NamespacedName{Namespace: ns, Name: name}, WebhookConfiguration: cr.WebhookConfiguration,
			Cert:        certs.Options{Service: cr.Service, Namespace: ns, Hosts: cr.Hosts, Validity: cr.Validity},
			RenewBefore: cr.RenewBefore, Interval: cr.Interval, Log: log.WithName("certificates"), Metrics: cm, Clientset: certClients}
		if err := mgr.Add(rot); err != nil {
			return nil, nil, fmt.Errorf("certificate rotation: %w", err)
		}
		if err := mgr.Add(&certrotation.Bootstrap{Rotator: rot, Source: source, Every: 5 * time.Second}); err != nil {
			return nil, nil, fmt.Errorf("certificate bootstrap: %w", err)
		}
	}
	if so.Repin.Enabled {
		rm, err := repin.NewMetrics(reg)
		if err != nil {
			return nil, nil, err
		}
		r := &repin.Reconciler{Options: so.Repin, Names: so.Handlers.Names, View: view, Decider: mut.Decider, Client: mgr.GetClient(), Reader: mgr.GetAPIReader(),
			Recorder: mgr.GetEventRecorder("nvdomain-repin"), Metrics: rm, Log: log.WithName("repin")}
		if err := r.Setup(mgr); err != nil {
			return nil, nil, fmt.Errorf("re-pin controller: %w", err)
		}
	}
	if so.IMEXChannels {
		// Bounded: the first answer is asked for before serving, and a hung apiserver must
		// not hold the replica's start for ever (the answer then stays "not served" until
		// the next recheck).
		dc, err := discovery.NewDiscoveryClientForConfig(bounded(cfg))
		if err != nil {
			return nil, nil, fmt.Errorf("IMEX channels: %w", err)
		}
		presence := &imex.Presence{Discovery: dc, Recheck: so.IMEXRecheck, Log: log.WithName("imex")}
		// Asked once now, so that the first admissions know.
		presence.Check()
		mut.ComputeDomains = presence
		if err := mgr.Add(presence); err != nil {
			return nil, nil, fmt.Errorf("IMEX channels: %w", err)
		}
		r := &imex.Reconciler{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Presence: presence, Names: so.Handlers.Names, Log: log.WithName("imex")}
		if err := r.Setup(mgr); err != nil {
			return nil, nil, fmt.Errorf("IMEX channels: %w", err)
		}
	}
	if so.KueueWatch {
		km, err := kueuewatch.NewMetrics(reg)
		if err != nil {
			return nil, nil, err
		}
		dc, err := discovery.NewDiscoveryClientForConfig(cfg)
		if err != nil {
			return nil, nil, fmt.Errorf("kueue watch: %w", err)
		}
		dyn, err := dynamic.NewForConfig(cfg)
		if err != nil {
			return nil, nil, fmt.Errorf("kueue watch: %w", err)
		}
		kw := &kueuewatch.Watch{Dynamic: dyn, Discovery: dc, Names: so.Handlers.Names, Recorder: mgr.GetEventRecorder("nvdomain-kueue"),
			Metrics: km, Log: log.WithName("kueue"), Recheck: kueuewatch.DefaultRecheck}
		if err := mgr.Add(kw); err != nil {
			return nil, nil, fmt.Errorf("kueue watch: %w", err)
		}
	}
	if so.Drain == nil {
		so.Drain = &Drain{}
	}
	if so.DRATemplates.Enabled {
		o := so.DRATemplates
		o.Sizes, o.ExcludedNamespaces = so.Handlers.AllowedTPSizes, so.Handlers.ExcludedNamespaces
		r := &dratemplates.Reconciler{Options: o, Client: mgr.GetClient(), Log: log.WithName("dratemplates")}
		if err := r.Setup(mgr); err != nil {
			return nil, nil, fmt.Errorf("ResourceClaimTemplate controller: %w", err)
		}
		if o.Reservations {
			rc := &reservations.Controller{Options: so.DRAReservations, Pods: mgr.GetClient(), Reader: mgr.GetAPIReader(), Writer: mgr.GetClient(),
				View: view, Log: log.WithName("reservations")}
			if err := mgr.Add(rc); err != nil {
				return nil, nil, fmt.Errorf("DRA reservation controller: %w", err)
			}
			if err := mgr.Add(&reservations.Follower{Options: so.DRAReservations, Reader: mgr.GetAPIReader(), View: view, Log: log.WithName("reservations")}); err != nil {
				return nil, nil, fmt.Errorf("DRA reservation follower: %w", err)
			}
		}
	}
	var mh, vh, lh admission.Handler = mut, val, &LWSValidator{Decider: val.Decider, Metrics: metrics, Log: log.WithName("validate-lws")}
	if so.AdmissionOverride != nil {
		mh, vh, lh = so.AdmissionOverride, so.AdmissionOverride, so.AdmissionOverride
	}
	srv := mgr.GetWebhookServer()
	srv.Register(MutatePath, so.Drain.Handler(&crwebhook.Admission{Handler: mh}))
	srv.Register(ValidatePath, so.Drain.Handler(&crwebhook.Admission{Handler: vh}))
	srv.Register(ValidateLWSPath, so.Drain.Handler(&crwebhook.Admission{Handler: lh}))
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return nil, nil, err
	}
	// Ready only when the webhook serves and the view has seen every node and pod: answering
	// from a half-filled view would pin pods to domains that are already full.
	if err := mgr.AddReadyzCheck("webhook", srv.StartedChecker()); err != nil {
		return nil, nil, err
	}
	if err := mgr.AddReadyzCheck("draining", so.Drain.Check); err != nil {
		return nil, nil, err
	}
	if pools != nil {
		if err := mgr.AddReadyzCheck("pools", func(*http.Request) error { return pools.Ready() }); err != nil {
			return nil, nil, err
		}
	}
	if err := mgr.AddReadyzCheck("cluster-view", func(*http.Request) error {
		for _, s := range synced {
			if !s.HasSynced() {
				return errors.New("the cluster view's informers (nodes, pods, and the claims and pools ConfigMap where configured) have not synced yet")
			}
		}
		return nil
	}); err != nil {
		return nil, nil, err
	}
	return mgr, view, nil
}

// feedView connects node and pod informers to the view, and with claims the ResourceClaim one.
func feedView(c cache.Cache, view *clusterview.View, claims bool) ([]toolscache.ResourceEventHandlerRegistration, error) {
	ctx := context.Background()
	nodes, err := c.GetInformer(ctx, &corev1.Node{})
	if err != nil {
		return nil, fmt.Errorf("node informer: %w", err)
	}
	pods, err := c.GetInformer(ctx, &corev1.Pod{})
	if err != nil {
		return nil, fmt.Errorf("pod informer: %w", err)
	}
	nreg, err := nodes.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { upsertNode(view, obj) },
		UpdateFunc: func(_, obj any) { upsertNode(view, obj) },
		DeleteFunc: func(obj any) {
			if n, ok := tombstone(obj).(*corev1.Node); ok {
				view.DeleteNode(n.Name)
			}
		},
	})
	if err != nil {
		return nil, err
	}
	preg, err := pods.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { upsertPod(view, obj) },
		UpdateFunc: func(old, obj any) {
			// A relist after a watch gap delivers a pod deleted and created again under the
			// same name (a StatefulSet's, a LeaderWorkerSet's) as an update: the old UID's
			// GPUs and pins must go with it.
			if o, ok := old.(*corev1.Pod); ok {
				if p, ok := obj.(*corev1.Pod); ok && o.UID != p.UID {
					view.DeletePod(o.UID)
				}
			}
			upsertPod(view, obj)
		},
		DeleteFunc: func(obj any) {
			if p, ok := tombstone(obj).(*corev1.Pod); ok {
				view.DeletePod(p.UID)
			}
		},
	})
	if err != nil {
		return nil, err
	}
	regs := []toolscache.ResourceEventHandlerRegistration{nreg, preg}
	if !claims {
		return regs, nil
	}
	rcs, err := c.GetInformer(ctx, &resourceapi.ResourceClaim{})
	if err != nil {
		return nil, fmt.Errorf("ResourceClaim informer: %w", err)
	}
	creg, err := rcs.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { upsertClaim(view, obj) },
		UpdateFunc: func(old, obj any) {
			// As for pods: a claim deleted and made again under its name during a watch gap
			// arrives as an update, and the old UID's GPUs must go with it.
			if o, ok := old.(*resourceapi.ResourceClaim); ok {
				if c, ok := obj.(*resourceapi.ResourceClaim); ok && o.UID != c.UID {
					view.DeleteClaim(o.UID)
				}
			}
			upsertClaim(view, obj)
		},
		DeleteFunc: func(obj any) {
			if c, ok := tombstone(obj).(*resourceapi.ResourceClaim); ok {
				view.DeleteClaim(c.UID)
			}
		},
	})
	if err != nil {
		return nil, err
	}
	return append(regs, creg), nil
}

func upsertClaim(view *clusterview.View, obj any) {
	if c, ok := obj.(*resourceapi.ResourceClaim); ok {
		view.UpsertClaim(c)
	}
}

func upsertNode(view *clusterview.View, obj any) {
	if n, ok := obj.(*corev1.Node); ok {
		view.UpsertNode(n)
	}
}

func upsertPod(view *clusterview.View, obj any) {
	if p, ok := obj.(*corev1.Pod); ok {
		view.UpsertPod(p)
	}
}

func tombstone(obj any) any {
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		return t.Obj
	}
	return obj
}

// checkPodGroups asks the cluster whether it keeps PodGroups with a topology constraint
// (podgroups.Check), with a dry-run create in namespace (the release's; "default" when the
// webhook runs outside a pod).
func checkPodGroups(cfg *rest.Config, namespace string, log logr.Logger) (ok bool, reason string, err error) {
	cfg = bounded(cfg)
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return false, "", fmt.Errorf("discovery client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return false, "", fmt.Errorf("dynamic client: %w", err)
	}
	if namespace == "" {
		namespace = metav1.NamespaceDefault
	}
	// A fresh install may reach the apiserver before its RBAC has propagated: a minute of
	// tries before giving up.
	for try := 1; ; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ok, reason, err = podgroups.Check(ctx, dc, dyn, namespace)
		cancel()
		if err == nil || try == 12 {
			return ok, reason, err
		}
		log.Info("asking again whether PodGroups can be written", "err", err.Error(), "try", try)
		time.Sleep(5 * time.Second)
	}
}

// bounded is cfg with a 10 s request timeout, for the start-up checks asked before serving: a
// hung apiserver must not hold a replica's start for ever.
func bounded(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.Timeout = 10 * time.Second
	return cfg
}

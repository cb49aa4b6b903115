// Package kueuewatch is the webhook Deployment's watch on Kueue. On the elected leader it
// follows Kueue's Workloads and, when Kueue holds one back because its ClusterQueue does not
// cover nvdomain's per-domain resource, records one Warning Event on the Workload and on
// what owns it (the pod, Job or LeaderWorkerSet the user looks at), naming the Kueue setting
// that fixes it (pkg/queueing). Without the Warning such pods stay gated for ever, silently.
//
// Kueue is optional and may be installed after nvdomain: without its API the watch asks
// discovery again every Recheck. A Kueue that serves Workloads only at a version nvdomain does
// not read is logged, with the version it needs, and asked about again; it is never a crash.
package kueuewatch

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"

	"github.com/nvdomain/nvdomain/pkg/kubeevents"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/queueing"
)

// WorkloadsGVR is the Kueue API the watch reads.
var WorkloadsGVR = schema.GroupVersionResource{Group: names.KueueGroup, Version: names.KueueWorkloadVersion, Resource: "workloads"}

// API states, the values of nvdomain_kueue_api's state label.
const (
	StateAbsent      = "absent"
	StateUnsupported = "unsupported"
	StateWatched     = "watched"
)

// Metrics are the watch's series.
type Metrics struct {
	// Refused counts the Workloads Kueue holds back now for a per-domain resource.
	Refused prometheus.Gauge
	// API is 1 for the state of Kueue's API the watch found last, 0 for the others.
	API *prometheus.GaugeVec
}

// NewMetrics registers the series with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		Refused: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nvdomain_kueue_refused_workloads",
			Help: "Kueue Workloads held back because their ClusterQueue does not cover nvdomain's per-domain resource (leader only); the fix is Kueue's resources.excludeResourcePrefixes.",
		}),
		API: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "nvdomain_kueue_api",
			Help: "1 for the state of Kueue's Workload API the webhook found: absent, unsupported (no " + names.KueueWorkloadVersion + "), or watched (leader only).",
		}, []string{"state"}),
	}
	for _, c := range []prometheus.Collector{m.Refused, m.API} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register Kueue watch metrics: %w", err)
		}
	}
	return m, nil
}

// DefaultRecheck is how often the leader asks discovery for Kueue's API while it is absent:
// one cheap GET, so that installing Kueue after nvdomain is noticed within half a minute.
const DefaultRecheck = 30 * time.Second

// Watch is the Runnable the webhook's manager starts on its leader.
type Watch struct {
	Dynamic   dynamic.Interface
	Discovery discovery.DiscoveryInterface
	Names     names.Names
	Recorder  events.EventRecorder
	Metrics   *Metrics
	Log       logr.Logger
	// Recheck is how often discovery is asked again while Kueue's API is absent or of a
	// version nvdomain does not read.
	Recheck time.Duration
	// Now is the clock (time.Now when nil); read under mu.
	Now func() time.Time

	mu     sync.Mutex
	marked map[types.UID]mark
}

// mark is what the watch remembers of a Workload Kueue refused for a per-domain resource,
// until Kueue admits it or it is deleted: Kueue's message can alternate between a refusal and
// another reason from one attempt to the next (its flavor assigner stops at the first
// resource that fails, in map order), which must not make a second Warning.
type mark struct {
	resource string
	warnedAt time.Time
	refused  bool // the last condition seen names the resource
}

// Rewarn is how long a Warning stands before a Workload still refused gets another: Events
// expire after an hour, and a refusal that outlives its Event would be a silent gate again.
// The informer's resync (Resync) brings every Workload back to be looked at.
const (
	Rewarn = 45 * time.Minute
	Resync = 10 * time.Minute
)

// maxOwnerEvents bounds the Events on the objects that own one Workload: a Kueue pod group's
// Workload is owned by each of its pods, and a tenant can add owner references of its own.
const maxOwnerEvents = 4

// NeedLeaderElection keeps the watch to one replica, so each Warning is written once.
func (w *Watch) NeedLeaderElection() bool { return true }

// Start waits for Kueue's API, then watches Workloads until ctx ends; when the API goes
// (Kueue uninstalled or downgraded) it waits for it again.
func (w *Watch) Start(ctx context.Context) error {
	lastState := ""
	for {
		state, detail := w.apiState()
		if state != lastState {
			w.setState(state)
			switch state {
			case StateUnsupported:
				w.Log.Error(nil, "Kueue is installed but serves no Workload API nvdomain reads: its pods' quota refusals of nvdomain's per-domain resource will not be reported; upgrade Kueue to v0.15 or later", "served", detail, "needed", WorkloadsGVR.GroupVersion().String())
			case StateWatched:
				w.Log.Info("watching Kueue Workloads for quota refusals of nvdomain's per-domain resource", "api", WorkloadsGVR.GroupVersion().String())
			}
			lastState = state
		}
		if state == StateWatched {
			if err := w.run(ctx); err != nil || ctx.Err() != nil {
				return err
			}
			w.Log.Info("Kueue's Workload API is gone: waiting for it again", "api", WorkloadsGVR.GroupVersion().String())
			lastState = ""
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(w.Recheck):
		}
	}
}

// apiState asks discovery whether Kueue serves Workloads at the version nvdomain reads.
func (w *Watch) apiState() (state, detail string) {
	if _, err := w.Discovery.ServerResourcesForGroupVersion(WorkloadsGVR.GroupVersion().String()); err == nil {
		return StateWatched, ""
	} else if !apierrors.IsNotFound(err) {
		// Discovery failed for another reason (the apiserver is unreachable): ask again later,
		// reporting nothing new.
		w.Log.V(1).Info("Kueue discovery failed", "err", err)
		return StateAbsent, ""
	}
	groups, err := w.Discovery.ServerGroups()
	if err != nil {
		return StateAbsent, ""
	}
	for _, g := range groups.Groups {
		if g.Name != names.KueueGroup {
			continue
		}
		var versions []string
		for _, v := range g.Versions {
			versions = append(versions, v.GroupVersion)
		}
		return StateUnsupported, fmt.Sprint(versions)
	}
	return StateAbsent, ""
}

func (w *Watch) setState(state string) {
	if w.Metrics == nil {
		return
	}
	for _, s := range []string{StateAbsent, StateUnsupported, StateWatched} {
		v := 0.0
		if s == state {
			v = 1
		}
		w.Metrics.API.WithLabelValues(s).Set(v)
	}
}

// run watches Workloads until ctx ends (nil) or the API stops being served (nil too, with
// the marks and the gauge cleared): the caller then waits for the API again.
func (w *Watch) run(ctx context.Context) error {
	w.mu.Lock()
	w.marked = map[types.UID]mark{}
	w.mu.Unlock()
	defer w.clear()
	inf := dynamicinformer.NewFilteredDynamicInformer(w.Dynamic, WorkloadsGVR, metav1.NamespaceAll, Resync, toolscache.Indexers{}, nil).Informer()
	// A Workload carries its pods' whole templates; the watch needs only who owns it and its
	// conditions.
	if err := inf.SetTransform(strip); err != nil {
		return fmt.Errorf("kueue watch: %w", err)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	// The CRD deleted (Kueue uninstalled, or downgraded below v1beta2): the list answers 404
	// for ever. Stop, and let Start ask discovery again.
	if err := inf.SetWatchErrorHandler(func(r *toolscache.Reflector, err error) {
		if apierrors.IsNotFound(err) {
			stop()
			return
		}
		toolscache.DefaultWatchErrorHandler(ctx, r, err)
	}); err != nil {
		return fmt.Errorf("kueue watch: %w", err)
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.observe(obj) },
		UpdateFunc: func(_, obj any) { w.observe(obj) },
		DeleteFunc: func(obj any) { w.forget(obj) },
	}); err != nil {
		return fmt.Errorf("kueue watch: %w", err)
	}
	inf.Run(runCtx.Done())
	return nil
}

// clear forgets every mark, when the watch stops.
func (w *Watch) clear() {
	w.mu.Lock()
	w.marked = nil
	w.mu.Unlock()
	if w.Metrics != nil {
		w.Metrics.Refused.Set(0)
	}
}

// strip keeps what observe reads.
func strip(obj any) (any, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return obj, nil
	}
	out := &unstructured.Unstructured{Object: map[string]any{}}
	out.SetAPIVersion(u.GetAPIVersion())
	out.SetKind(u.GetKind())
	out.SetName(u.GetName())
	out.SetNamespace(u.GetNamespace())
	out.SetUID(u.GetUID())
	out.SetResourceVersion(u.GetResourceVersion())
	out.SetOwnerReferences(u.GetOwnerReferences())
	if conds, found, _ := unstructured.NestedFieldNoCopy(u.Object, "status", "conditions"); found {
		out.Object["status"] = map[string]any{"conditions": conds}
	}
	return out, nil
}

// observe records the Warning the first time a Workload is refused for a resource, again
// after Rewarn while it stays refused, and keeps the gauge equal to the Workloads whose last
// condition is such a refusal.
func (w *Watch) observe(obj any) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	resource, refused := queueing.RefusedDomainResource(u, w.Names)
	warn := false
	w.mu.Lock()
	now := time.Now
	if w.Now != nil {
		now = w.Now
	}
	if w.marked == nil {
		w.mu.Unlock()
		return // the watch has stopped
	}
	m, had := w.marked[u.GetUID()]
	switch {
	case refused:
		if !had || m.resource != resource || now().Sub(m.warnedAt) >= Rewarn {
			warn = true
			m.resource, m.warnedAt = resource, now()
		}
		m.refused = true
		w.marked[u.GetUID()] = m
	case had && queueing.QuotaReserved(u):
		delete(w.marked, u.GetUID())
	case had:
		m.refused = false
		w.marked[u.GetUID()] = m
	}
	n := w.refusedLocked()
	w.mu.Unlock()
	if w.Metrics != nil {
		w.Metrics.Refused.Set(float64(n))
	}
	if !warn {
		return
	}
	msg := queueing.KueueFix(resource, w.Names)
	w.Log.Info("Kueue holds a workload back for nvdomain's per-domain resource", "workload", u.GetNamespace()+"/"+u.GetName(), "resource", resource, "message", msg)
	w.Recorder.Eventf(u, nil, corev1.EventTypeWarning, queueing.ReasonKueueRefusesDomainResource, "Admit", "%s", kubeevents.Cap(msg))
	for _, o := range owners(u) {
		w.Recorder.Eventf(kubeevents.OwnerObject(u.GetNamespace(), o), nil, corev1.EventTypeWarning, queueing.ReasonKueueRefusesDomainResource, "Admit", "%s",
			kubeevents.Cap(queueing.OwnerMessage(u.GetName(), msg)))
	}
}

// owners are the objects a Workload's Warning is repeated on: its controller, or else the
// first maxOwnerEvents of its owners (a pod group's Workload is owned by each pod).
func owners(u *unstructured.Unstructured) []metav1.OwnerReference {
	refs := u.GetOwnerReferences()
	for _, r := range refs {
		if r.Controller != nil && *r.Controller {
			return []metav1.OwnerReference{r}
		}
	}
	return refs[:min(len(refs), maxOwnerEvents)]
}

func (w *Watch) refusedLocked() int {
	n := 0
	for _, m := range w.marked {
		if m.refused {
			n++
		}
	}
	return n
}

func (w *Watch) forget(obj any) {
	if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	w.mu.Lock()
	if w.marked == nil {
		w.mu.Unlock()
		return
	}
	delete(w.marked, u.GetUID())
	n := w.refusedLocked()
	w.mu.Unlock()
	if w.Metrics != nil {
		w.Metrics.Refused.Set(float64(n))
	}
}

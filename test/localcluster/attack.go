package localcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/nvdomain/nvdomain/pkg/names"
)

// Tenant namespaces of the attacker suite: Evil attacks, Team is the victim.
const (
	Evil = "evil"
	Team = "team"
)

// UnschedulableHold is the webhook's --unschedulable-hold on the attacker suite's cluster
// (SetExtraValues before Install): short, so the suite sees the hold end.
const UnschedulableHold = 30 * time.Second

// AttackReport is what the attacker suite found: what each attack got, how long the victim
// took to run in the free domain, and who holds which GPU at the end.
type AttackReport struct {
	// TrustedNamespace is what the apiserver said when the tenant created the GPU Operator's
	// namespace name the cluster does not use.
	TrustedNamespace string
	// EnvFrom: the pod whose envFrom names every GPU's UUID, as admitted and run (or the
	// refusal at apply).
	EnvFrom        PodResult
	EnvFromRefusal string
	// FreeDomain is the domain the filler leaves free; the victims must run there.
	FreeDomain string
	// Phantom room: failing creates the attacker made, and the victim's pod and wait.
	FailedCreates, SucceededCreates int
	PhantomVictim                   PodResult
	PhantomTook                     time.Duration
	// Pods that can never bind: the blockers' RoomReleased Event, and the victim's pod and wait.
	RoomReleased  string
	BlockedVictim PodResult
	BlockedTook   time.Duration
	// A crash-looping TP pod: its restarts and GPUs (from its assigned-gpus annotation), and
	// the pod beside it.
	CrashRestarts int32
	CrashGPUs     string
	BesideCrash   PodResult
	// A pod that asks for no GPU on a CUDA image (ENV NVIDIA_VISIBLE_DEVICES=all): with the
	// plugin up, created while the plugin is down (as a restart during a rollout would be)
	// under the toolkit's default, and the same with
	// accept-nvidia-visible-devices-envvar-when-unprivileged = false (docs/node-side.md).
	CUDAPluginUp, CUDAPluginDown, CUDAPluginDownClosed PodResult
	// CUDAError is why (F) could not run to its end ("" when it did).
	CUDAError string
	// Held is, at the end, each running pod's GPUs; DoubleHeld the GPUs two pods hold.
	Held       []PodResult
	DoubleHeld []string
}

// tenantClient is a client acting as namespace ns's tenant ServiceAccount (impersonated).
func (c *Cluster) tenantClient(ns string) (*kubernetes.Clientset, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.Impersonate.UserName = "system:serviceaccount:" + ns + ":tenant"
	return kubernetes.NewForConfig(cfg)
}

// setUpTenants makes the two tenant namespaces with a ServiceAccount each that may manage
// pods, Deployments and ConfigMaps in its own namespace only; the attacker may also create
// namespaces (namespace self-service).
func (c *Cluster) setUpTenants(ctx context.Context, cs *kubernetes.Clientset) error {
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "e2e-tenant"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods", "configmaps"}, Verbs: []string{"get", "list", "watch", "create", "delete", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"pods/log"}, Verbs: []string{"get"}},
		{APIGroups: []string{"apps"}, Resources: []string{"deployments"}, Verbs: []string{"get", "list", "create", "delete"}},
	}}
	selfService := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "e2e-namespace-self-service"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"create"}},
	}}
	for _, r := range []*rbacv1.ClusterRole{role, selfService} {
		if _, err := cs.RbacV1().ClusterRoles().Create(ctx, r, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("tenant role: %w", err)
		}
	}
	for _, ns := range []string{Evil, Team} {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			return err
		}
		if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "tenant"}}, metav1.CreateOptions{}); err != nil {
			return err
		}
		rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "tenant", Namespace: ns},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "e2e-tenant"},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "tenant", Namespace: ns}}}
		if _, err := cs.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "e2e-namespace-self-service"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "e2e-namespace-self-service"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "tenant", Namespace: Evil}}}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
		return err
	}
	// The authorizer sees new bindings through its informers: until it does, a tenant's
	// create is refused by RBAC, not by what the attack is about.
	for _, can := range []struct{ ns, resource string }{{Evil, "pods"}, {Team, "pods"}, {"", "namespaces"}} {
		tenant := Evil
		if can.ns != "" {
			tenant = can.ns
		}
		as, err := c.tenantClient(tenant)
		if err != nil {
			return err
		}
		review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: can.ns, Verb: "create", Resource: can.resource}}}
		if err := waitUntil(ctx, 30*time.Second, "tenant "+tenant+" may create "+can.resource, func() bool {
			r, err := as.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
			return err == nil && r.Status.Allowed
		}); err != nil {
			return err
		}
	}
	return nil
}

func tpPodIn(ns, name string, k int64) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: tpLabels(name)}, Spec: tpPodSpec(k)}
}

// waitRunning waits for pod ns/name to run and report its GPUs.
func (c *Cluster) waitRunning(ctx context.Context, cs *kubernetes.Clientset, ns, name string, timeout time.Duration, rep *Report) (PodResult, error) {
	var r PodResult
	err := waitUntil(ctx, timeout, ns+"/"+name+" Running", func() bool {
		p, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil || p.Status.Phase != corev1.PodRunning {
			return false
		}
		r = c.observe(p, rep)
		return r.Seen
	})
	if err != nil {
		desc, _, _ := c.Kubectl("describe", "pod", "-n", ns, name)
		return r, fmt.Errorf("%w\n%s", err, desc)
	}
	return r, nil
}

// RunAttacks runs the attacker suite on an installed classic cluster: a tenant that creates
// the GPU Operator's other namespace, names every GPU through envFrom, loops failing creates
// mixed with successful ones (phantom room), pins two pods that can never bind to the free
// domain, and crash-loops a TP pod, while another tenant's TP=4 pods must run in the free
// domain within a bound. It ends with who holds which GPU.
func (c *Cluster) RunAttacks(ctx context.Context, w io.Writer, rep *Report) (*AttackReport, error) {
	cs, err := c.client()
	if err != nil {
		return nil, err
	}
	say := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	ar := &AttackReport{}
	if err := c.clearDefault(ctx, cs); err != nil {
		return ar, err
	}
	if err := c.setUpTenants(ctx, cs); err != nil {
		return ar, err
	}
	evil, err := c.tenantClient(Evil)
	if err != nil {
		return ar, err
	}
	team, err := c.tenantClient(Team)
	if err != nil {
		return ar, err
	}

	say("\n== (A) the tenant creates the GPU Operator namespace the cluster does not use (trusted by name)")
	_, err = evil.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "nvidia-gpu-operator"}}, metav1.CreateOptions{})
	if err == nil {
		ar.TrustedNamespace = "created"
	} else {
		ar.TrustedNamespace = err.Error()
	}
	say("  %s", ar.TrustedNamespace)

	say("\n== (B) a 1-GPU pod whose envFrom names every GPU's UUID")
	var uuids []string
	for _, g := range rep.Topology.GPUs {
		if g.UUID != "" {
			uuids = append(uuids, g.UUID)
		}
	}
	if _, err := evil.CoreV1().ConfigMaps(Evil).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "all-gpus"},
		Data: map[string]string{names.VisibleDevicesEnv: strings.Join(uuids, ",")}}, metav1.CreateOptions{}); err != nil {
		return ar, err
	}
	greedy := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "greedy", Namespace: Evil}, Spec: tpPodSpec(1)}
	greedy.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "all-gpus"}}}}
	if _, err := evil.CoreV1().Pods(Evil).Create(ctx, greedy, metav1.CreateOptions{}); err != nil {
		ar.EnvFromRefusal = err.Error()
		say("  refused: %s", err)
	} else {
		// Running with one GPU, or refused by the node (the kubelet allocated one): never more.
		_ = waitUntil(ctx, 60*time.Second, "greedy judged", func() bool {
			p, err := cs.CoreV1().Pods(Evil).Get(ctx, "greedy", metav1.GetOptions{})
			if err != nil {
				return false
			}
			if p.Status.Phase == corev1.PodRunning {
				ar.EnvFrom = c.observe(p, rep)
				return ar.EnvFrom.Seen
			}
			for _, st := range p.Status.ContainerStatuses {
				if st.State.Waiting != nil && st.State.Waiting.Reason == "CreateContainerError" {
					ar.EnvFromRefusal = st.State.Waiting.Message
					return true
				}
			}
			return false
		})
		say("  greedy: GPUs %v %s", ar.EnvFrom.GPUs, ar.EnvFromRefusal)
		_ = evil.CoreV1().Pods(Evil).Delete(ctx, "greedy", metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
		// Gone, so its GPU is back in the room the node advertises before the filler comes.
		_ = waitUntil(ctx, 60*time.Second, "greedy gone", func() bool {
			_, err := cs.CoreV1().Pods(Evil).Get(ctx, "greedy", metav1.GetOptions{})
			return apierrors.IsNotFound(err)
		})
	}

	say("\n== a filler TP=4 of the team takes one domain; the other is the only room")
	// The kubelet admits a pod against its device manager's count, which the agent's device
	// plugin updates before the Node's status shows it: a pod scheduled in between is refused
	// with OutOf<resource> and fails for good (seen once in CI, right after greedy's GPU came
	// back). A controller would create another; so does the suite, which is about tenants.
	for attempt := 1; ; attempt++ {
		if _, err := team.CoreV1().Pods(Team).Create(ctx, tpPodIn(Team, "filler", 4), metav1.CreateOptions{}); err != nil {
			return ar, err
		}
		var refused string
		_ = waitUntil(ctx, 30*time.Second, "filler admitted", func() bool {
			p, err := cs.CoreV1().Pods(Team).Get(ctx, "filler", metav1.GetOptions{})
			if err != nil {
				return false
			}
			if p.Status.Phase == corev1.PodFailed && strings.HasPrefix(p.Status.Reason, "OutOf") {
				refused = p.Status.Reason + ": " + p.Status.Message
				return true
			}
			return p.Status.Phase == corev1.PodRunning
		})
		if refused == "" || attempt == 3 {
			break
		}
		say("  filler refused at the kubelet's admission (%s); created again, as a controller would", refused)
		_ = team.CoreV1().Pods(Team).Delete(ctx, "filler", metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
		_ = waitUntil(ctx, 60*time.Second, "refused filler gone", func() bool {
			_, err := cs.CoreV1().Pods(Team).Get(ctx, "filler", metav1.GetOptions{})
			return apierrors.IsNotFound(err)
		})
	}
	filler, err := c.waitRunning(ctx, cs, Team, "filler", 90*time.Second, rep)
	if err != nil {
		return ar, err
	}
	ar.FreeDomain = map[string]string{"0": "1", "1": "0"}[filler.Domain]
	say("  filler runs in domain %s; domain %s is free", filler.Domain, ar.FreeDomain)

	say("\n== (C) phantom room: every reservation TTL, one successful create, then one TP=4 create that ResourceQuota refuses")
	quota := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "gpus", Namespace: Evil},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{"requests.nvidia.com/gpu": resource.MustParse("2")}}}
	if _, err := cs.CoreV1().ResourceQuotas(Evil).Create(ctx, quota, metav1.CreateOptions{}); err != nil {
		return ar, err
	}
	attackCtx, stopAttack := context.WithCancel(ctx)
	attackDone := make(chan struct{})
	go func() {
		defer close(attackDone)
		// The pattern of review classic H1: the successful create's pod consumes its
		// reservation, which used to end the namespace's failing mark, so the failing create
		// right after it held the free domain for a whole TTL, every TTL.
		for i := 0; attackCtx.Err() == nil; i++ {
			ok := tpPodIn(Evil, fmt.Sprintf("ok-%d", i), 2)
			ok.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "example.com/hold"}}
			if _, err := evil.CoreV1().Pods(Evil).Create(attackCtx, ok, metav1.CreateOptions{}); err == nil {
				ar.SucceededCreates++
			}
			time.Sleep(500 * time.Millisecond) // the informer delivers it: its reservation is consumed
			p := tpPodIn(Evil, "", 4)
			p.GenerateName, p.Labels = "phantom-", tpLabels("phantom")
			if _, err := evil.CoreV1().Pods(Evil).Create(attackCtx, p, metav1.CreateOptions{}); err != nil {
				ar.FailedCreates++
			}
			_ = evil.CoreV1().Pods(Evil).Delete(attackCtx, ok.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
			// The next round once this one's reservation has expired (the reservations' TTL
			// is 10 s), so the namespace is already marked failing when the success arrives.
			select {
			case <-attackCtx.Done():
			case <-time.After(11 * time.Second):
			}
		}
	}()
	select {
	case <-ctx.Done():
	case <-time.After(15 * time.Second): // inside the second round's TTL
	}
	start := time.Now()
	if _, err := team.CoreV1().Pods(Team).Create(ctx, tpPodIn(Team, "victim-phantom", 4), metav1.CreateOptions{}); err != nil {
		stopAttack()
		<-attackDone
		return ar, err
	}
	ar.PhantomVictim, err = c.waitRunning(ctx, cs, Team, "victim-phantom", 90*time.Second, rep)
	ar.PhantomTook = time.Since(start)
	stopAttack()
	<-attackDone
	say("  %d failing and %d successful creates; victim-phantom runs in domain %s after %s", ar.FailedCreates, ar.SucceededCreates, ar.PhantomVictim.Domain, ar.PhantomTook.Round(100*time.Millisecond))
	if err != nil {
		return ar, err
	}
	_ = cs.CoreV1().ResourceQuotas(Evil).Delete(ctx, "gpus", metav1.DeleteOptions{})
	_ = cs.CoreV1().Pods(Team).Delete(ctx, "victim-phantom", metav1.DeleteOptions{})
	if err := waitUntil(ctx, 60*time.Second, "victim-phantom gone", func() bool {
		_, err := cs.CoreV1().Pods(Team).Get(ctx, "victim-phantom", metav1.GetOptions{})
		return err != nil
	}); err != nil {
		return ar, err
	}

	say("\n== (D) two bare TP=4 pods hand-pinned to the free domain with a pod affinity no pod satisfies")
	n := names.Default()
	var free int
	fmt.Sscan(ar.FreeDomain, &free)
	for i := range 2 {
		p := tpPodIn(Evil, fmt.Sprintf("blocker-%d", i), 4)
		p.Spec.Containers[0].Resources.Limits[corev1.ResourceName(n.DomainResource(free))] = resource.MustParse("4")
		p.Spec.Affinity = &corev1.Affinity{PodAffinity: &corev1.PodAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"no-pod": "has-this"}}, TopologyKey: "kubernetes.io/hostname"}}}}
		if _, err := evil.CoreV1().Pods(Evil).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return ar, fmt.Errorf("blocker: %w", err)
		}
	}
	start = time.Now()
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "victim-blocked", Namespace: Team}, Spec: appsv1.DeploymentSpec{
		Replicas: ptr.To(int32(1)), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "victim-blocked"}},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: tpLabels("victim-blocked")}, Spec: tpPodSpec(4)}}}
	if _, err := team.AppsV1().Deployments(Team).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		return ar, err
	}
	err = waitUntil(ctx, UnschedulableHold+3*time.Minute, "a pod of victim-blocked Running", func() bool {
		list, err := cs.CoreV1().Pods(Team).List(ctx, metav1.ListOptions{LabelSelector: "app=victim-blocked"})
		if err != nil {
			return false
		}
		for i := range list.Items {
			p := &list.Items[i]
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				if r := c.observe(p, rep); r.Seen {
					ar.BlockedVictim = r
					return true
				}
			}
		}
		return false
	})
	ar.BlockedTook = time.Since(start)
	ar.RoomReleased = c.eventOf(Evil, "blocker-0", "RoomReleased")
	say("  victim-blocked runs in domain %s after %s; blocker-0's Event: %s", ar.BlockedVictim.Domain, ar.BlockedTook.Round(100*time.Millisecond), ar.RoomReleased)
	if err != nil {
		desc, _, _ := c.Kubectl("describe", "pods", "-n", Team)
		return ar, fmt.Errorf("%w\n%s", err, desc)
	}
	_ = team.AppsV1().Deployments(Team).Delete(ctx, "victim-blocked", metav1.DeleteOptions{})
	for i := range 2 {
		_ = evil.CoreV1().Pods(Evil).Delete(ctx, fmt.Sprintf("blocker-%d", i), metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
	}
	if err := waitUntil(ctx, 60*time.Second, "victim-blocked's pods gone", func() bool {
		list, err := cs.CoreV1().Pods(Team).List(ctx, metav1.ListOptions{LabelSelector: "app=victim-blocked"})
		return err == nil && len(list.Items) == 0
	}); err != nil {
		return ar, err
	}

	say("\n== (E) a crash-looping TP=2 pod beside another tenant's TP=2 pod")
	crash := tpPodIn(Evil, "crash", 2)
	crash.Spec.Containers[0].Args = []string{ReportGPUs + " exit 1"}
	if _, err := evil.CoreV1().Pods(Evil).Create(ctx, crash, metav1.CreateOptions{}); err != nil {
		return ar, err
	}
	if _, err := team.CoreV1().Pods(Team).Create(ctx, tpPodIn(Team, "beside-crash", 2), metav1.CreateOptions{}); err != nil {
		return ar, err
	}
	if ar.BesideCrash, err = c.waitRunning(ctx, cs, Team, "beside-crash", 90*time.Second, rep); err != nil {
		return ar, err
	}
	_ = waitUntil(ctx, 60*time.Second, "crash restarted twice", func() bool {
		p, err := cs.CoreV1().Pods(Evil).Get(ctx, "crash", metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) == 0 {
			return false
		}
		ar.CrashRestarts = p.Status.ContainerStatuses[0].RestartCount
		ar.CrashGPUs = p.Annotations[n.PodAssignedGPUsAnnotation()]
		return ar.CrashRestarts >= 2
	})
	say("  crash restarted %d times holding GPUs %s; beside-crash runs in domain %s on GPUs %v", ar.CrashRestarts, ar.CrashGPUs, ar.BesideCrash.Domain, ar.BesideCrash.GPUs)

	// Who holds what: every running pod's GPUs as it sees them, and the crash looper's as
	// the plugin booked them.
	for _, ns := range []string{Team, Evil} {
		list, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return ar, err
		}
		for i := range list.Items {
			p := &list.Items[i]
			if ns == Evil && p.Name == "crash" {
				continue // between two restarts as often as running: its books below
			}
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				if r := c.observe(p, rep); r.Seen {
					r.Name = ns + "/" + r.Name
					ar.Held = append(ar.Held, r)
				}
			}
		}
	}
	if gpus, err := names.ParseGPUList(ar.CrashGPUs); err == nil {
		ar.Held = append(ar.Held, PodResult{Name: Evil + "/crash", GPUs: gpus})
	}
	holder := map[int]string{}
	for _, p := range ar.Held {
		for _, g := range p.GPUs {
			if other, ok := holder[g]; ok && other != p.Name {
				ar.DoubleHeld = append(ar.DoubleHeld, fmt.Sprintf("GPU %d: %s and %s", g, other, p.Name))
			}
			holder[g] = p.Name
		}
	}
	sort.Strings(ar.DoubleHeld)
	_ = evil.CoreV1().Pods(Evil).Delete(ctx, "crash", metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})

	// (F)'s failure is reported beside the others', not instead of them.
	if err := c.cudaImageWhilePluginDown(ctx, cs, evil, say, ar, rep); err != nil {
		ar.CUDAError = err.Error()
	}
	return ar, nil
}

// cudaImageWhilePluginDown is attack (F): a pod that asks for no GPU, on a CUDA base image
// whose ENV names every GPU, created while the NRI plugin is down, as a container restarted
// during a plugin rollout is. No policy sees an image's ENV and no required-plugins key is on
// such a pod, so only the toolkit's accept-nvidia-visible-devices-envvar-when-unprivileged =
// false closes it; the suite shows the attack open under the toolkit's default (so the stand-in
// toolkit really grants `all`) and closed under the setting.
func (c *Cluster) cudaImageWhilePluginDown(ctx context.Context, cs, evil *kubernetes.Clientset, say func(string, ...any), ar *AttackReport, rep *Report) (err error) {
	cudaPod := func(name string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Evil}, Spec: corev1.PodSpec{
			HostNetwork: true, TerminationGracePeriodSeconds: ptr.To(int64(0)),
			Containers: []corev1.Container{{Name: "cuda", Image: CUDAImage, Command: []string{"/bin/sh", "-c"},
				Args: []string{ReportGPUs + " trap 'exit 0' TERM; while true; do sleep 1; done"}}},
		}}
	}
	run := func(name string) (PodResult, error) {
		if _, err := evil.CoreV1().Pods(Evil).Create(ctx, cudaPod(name), metav1.CreateOptions{}); err != nil {
			return PodResult{}, err
		}
		r, err := c.waitRunning(ctx, cs, Evil, name, 90*time.Second, rep)
		_ = evil.CoreV1().Pods(Evil).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
		return r, err
	}
	say("\n== (F) a pod that asks for no GPU, on a CUDA image (ENV NVIDIA_VISIBLE_DEVICES=all)")
	if ar.CUDAPluginUp, err = run("cuda-plugin-up"); err != nil {
		return err
	}
	say("  with the NRI plugin up: GPUs %v (NVIDIA_VISIBLE_DEVICES=%s)", ar.CUDAPluginUp.GPUs, ar.CUDAPluginUp.Env)
	patch := `[{"op":"add","path":"/spec/template/spec/containers/1/args/-","value":"--source=file"},` +
		`{"op":"add","path":"/spec/template/spec/containers/1/args/-","value":"--topology-file=/plugin-stopped-by-the-attacker-suite"}]`
	if _, errOut, err := c.Kubectl("patch", "daemonset", "-n", "nvdomain-system", "nvdomain-node", "--type=json", "-p", patch); err != nil {
		return fmt.Errorf("break the NRI container: %v: %s", err, errOut)
	}
	say("$ kubectl patch daemonset nvdomain-node ...   # a rollout whose NRI container does not start")
	// Whatever happens below, the node gets its plugin and the toolkit its default back.
	defer func() {
		_, errOut, undoErr := c.Kubectl("rollout", "undo", "daemonset/nvdomain-node", "-n", "nvdomain-system")
		if undoErr != nil {
			undoErr = fmt.Errorf("restore the NRI container: %v: %s", undoErr, errOut)
		}
		err = errors.Join(err, undoErr, c.SetToolkitAcceptsEnvvarWhenUnprivileged(true), c.waitNodePod(ctx, true))
	}()
	if err := c.waitNodePod(ctx, false); err != nil {
		return err
	}
	if ar.CUDAPluginDown, err = run("cuda-plugin-down"); err != nil {
		return err
	}
	say("  plugin down, toolkit default: GPUs %v (open: docs/node-side.md, The tenant boundary)", ar.CUDAPluginDown.GPUs)
	if err := c.SetToolkitAcceptsEnvvarWhenUnprivileged(false); err != nil {
		return err
	}
	if ar.CUDAPluginDownClosed, err = run("cuda-plugin-down-closed"); err != nil {
		return err
	}
	say("  plugin down, accept-nvidia-visible-devices-envvar-when-unprivileged = false: GPUs %v", ar.CUDAPluginDownClosed.GPUs)
	return nil
}

// eventOf returns the message of the last Event of reason on pod ns/name ("" when none).
func (c *Cluster) eventOf(ns, name, reason string) string {
	out, _, _ := c.Kubectl("get", "events", "-n", ns, "--field-selector", "involvedObject.name="+name+",reason="+reason, "-o", "jsonpath={.items[-1:].message}")
	return strings.TrimSpace(out)
}

// Write prints the attacker suite's report.
func (ar *AttackReport) Write(w io.Writer) {
	fmt.Fprintln(w, "\nattacker suite:")
	fmt.Fprintf(w, "  (A) trusted namespace by name: %s\n", ar.TrustedNamespace)
	fmt.Fprintf(w, "  (B) envFrom naming every GPU: GPUs %v %s\n", ar.EnvFrom.GPUs, ar.EnvFromRefusal)
	fmt.Fprintf(w, "  (C) phantom room: %d failing + %d successful creates; victim in domain %s after %s (free domain %s)\n", ar.FailedCreates, ar.SucceededCreates, ar.PhantomVictim.Domain, ar.PhantomTook.Round(100*time.Millisecond), ar.FreeDomain)
	fmt.Fprintf(w, "  (D) pods that can never bind: victim in domain %s after %s; %s\n", ar.BlockedVictim.Domain, ar.BlockedTook.Round(100*time.Millisecond), ar.RoomReleased)
	fmt.Fprintf(w, "  (E) crash loop: %d restarts on GPUs %s; beside it GPUs %v\n", ar.CrashRestarts, ar.CrashGPUs, ar.BesideCrash.GPUs)
	fmt.Fprintf(w, "  (F) no-GPU pod on a CUDA image: plugin up GPUs %v; plugin down, toolkit default GPUs %v; plugin down, envvar refused for the unprivileged GPUs %v\n",
		ar.CUDAPluginUp.GPUs, ar.CUDAPluginDown.GPUs, ar.CUDAPluginDownClosed.GPUs)
	fmt.Fprintln(w, "  GPUs held at the end of (E):")
	for _, p := range ar.Held {
		fmt.Fprintf(w, "    %-24s %v\n", p.Name, p.GPUs)
	}
	fmt.Fprintf(w, "  double-held GPUs: %d %v\n", len(ar.DoubleHeld), ar.DoubleHeld)
}

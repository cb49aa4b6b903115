package agent

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/nvdomain/nvdomain/pkg/kubeevents"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/nristate"
)

func TestJudgeCanary(t *testing.T) {
	waiting := func(reason, msg string) corev1.ContainerStatus {
		return corev1.ContainerStatus{State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}}}
	}
	for _, tc := range []struct {
		name   string
		status corev1.PodStatus
		want   corev1.ConditionStatus
		done   bool
	}{
		{"refused by the validator", corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{waiting("CreateContainerError", `failed to create containerd container: validation error: required plugin "nvdomain-canary-absent" not present`)}}, corev1.ConditionTrue, true},
		{"started", corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}}, corev1.ConditionFalse, true},
		{"ran to completion", corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0}}}}}, corev1.ConditionFalse, true},
		{"succeeded, statuses gone: undecided", corev1.PodStatus{Phase: corev1.PodSucceeded}, corev1.ConditionUnknown, true},
		{"rejected by the kubelet (OutOfpods): undecided", corev1.PodStatus{Phase: corev1.PodFailed, Reason: "OutOfpods", Message: "Node didn't have enough resource: pods"}, corev1.ConditionUnknown, true},
		{"image not there yet", corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{waiting("ErrImagePull", "not found")}}, "", false},
		{"image pull backing off", corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{waiting("ImagePullBackOff", "Back-off pulling image")}}, "", false},
		{"refused for another reason", corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{waiting("CreateContainerError", "no space left on device")}}, "", false},
		{"pending", corev1.PodStatus{Phase: corev1.PodPending}, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, done := judgeCanary(&corev1.Pod{Status: tc.status})
			if done != tc.done || r.Status != tc.want {
				t.Errorf("judged %+v (decided %v), want %q (decided %v)", r, done, tc.want, tc.done)
			}
		})
	}
}

func TestCanaryName(t *testing.T) {
	if got := CanaryName("nvdomain-canary-", "gpu-node01"); got != "nvdomain-canary-gpu-node01" {
		t.Errorf("short name %q", got)
	}
	long := strings.Repeat("ip-10-0-0-1.ec2.internal-", 4)
	a, b := CanaryName("nvdomain-canary-", long+"a"), CanaryName("nvdomain-canary-", long+"b")
	if len(a) > 63 || a == b {
		t.Errorf("long names %q and %q: want ≤63 characters and distinct", a, b)
	}
}

// TestFailOpenNodeGetsNoRoom: the canary on a node whose containerd lets a container that
// requires an absent plugin start turns the NvdomainFailClosed condition False, labels the
// node, publishes every domain with no room, records an Event, and deletes the canary pod.
func TestFailOpenNodeGetsNoRoom(t *testing.T) {
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-node01"}})
	n := names.Default()
	a := New(Options{Names: n, Node: "gpu-node01", Source: &flakySource{top: seed(t)}, Client: client, Period: time.Hour, Log: logr.Discard(), Metrics: newMetrics(),
		Canary: CanaryOptions{Image: "ghcr.io/nvdomain/nvdomain:v1", Namespace: "nvdomain-system", NamePrefix: "nvdomain-canary-", Interval: time.Hour, Timeout: 20 * time.Second, WithholdCapacity: true}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The kubelet of a node without NRI's validator: the canary's container runs.
	fakeCanaryKubelet(ctx, client, corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}, func(p *corev1.Pod) {
		if p.Annotations["required-plugins.noderesource.dev/container.canary"] != "[nvdomain-canary-absent]" || p.Spec.NodeName != "gpu-node01" {
			t.Errorf("canary pod %+v", p)
		}
	})
	go a.Run(ctx)
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if c := condition(t, client, names.ConditionFailClosed); c != nil && c.Status == corev1.ConditionFalse {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	c := condition(t, client, names.ConditionFailClosed)
	if c == nil || c.Status != corev1.ConditionFalse || c.Reason != "CanaryStarted" || !strings.HasPrefix(c.Message, "enable NRI's default validator") {
		t.Fatalf("condition %+v: want False/CanaryStarted, fix first", c)
	}
	for time.Now().Before(deadline) {
		node, _ := client.CoreV1().Nodes().Get(ctx, "gpu-node01", metav1.GetOptions{})
		q := node.Status.Capacity[corev1.ResourceName(n.DomainResource(0))]
		if node.Labels[n.FailOpenLabel()] == "true" && q.Value() == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	node, _ := client.CoreV1().Nodes().Get(ctx, "gpu-node01", metav1.GetOptions{})
	for _, d := range []int{0, 1} {
		q, ok := node.Status.Capacity[corev1.ResourceName(n.DomainResource(d))]
		if !ok || q.Value() != 0 {
			t.Errorf("domain %d capacity %v (present %v), want 0 on a fail-open node", d, q.String(), ok)
		}
	}
	if node.Labels[n.FailOpenLabel()] != "true" {
		t.Errorf("labels %v: want %s=true", node.Labels, n.FailOpenLabel())
	}
	for time.Now().Before(deadline) {
		if _, err := client.CoreV1().Pods("nvdomain-system").Get(ctx, "nvdomain-canary-gpu-node01", metav1.GetOptions{}); err != nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Error("the canary pod was not deleted")
}

// TestCanaryWhoseImageCannotBePulledIsNotFailClosed: on a private registry the canary carries
// the release's pull secrets; a kubelet that still cannot pull its image (a wrong secret)
// leaves it waiting until the timeout, and the node's condition turns False, naming the
// kubelet's pull error and the value to set, instead of staying Unknown for ever.
func TestCanaryWhoseImageCannotBePulledIsNotFailClosed(t *testing.T) {
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-node01"}})
	n := names.Default()
	a := New(Options{Names: n, Node: "gpu-node01", Source: &flakySource{top: seed(t)}, Client: client, Period: time.Hour, Log: logr.Discard(), Metrics: newMetrics(),
		Canary: CanaryOptions{Image: "registry.corp/gpu/nvdomain:v1", Namespace: "nvdomain-system", NamePrefix: "nvdomain-canary-", Interval: time.Hour, Timeout: 3 * time.Second,
			WithholdCapacity: true, PullSecrets: []string{"regcred"}}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fakeCanaryKubelet(ctx, client, corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
		// containerd 2.4.2's words, as the private-registry e2e saw them: the cause is at the end.
		Reason: "ImagePullBackOff", Message: `Back-off pulling image "registry.corp/gpu/nvdomain:v1": ErrImagePull: failed to pull and unpack image "registry.corp/gpu/nvdomain:v1": failed to resolve image: unexpected status from HEAD request to https://registry.corp/v2/gpu/nvdomain/manifests/v1: 401 Unauthorized`}}, func(p *corev1.Pod) {
		if len(p.Spec.ImagePullSecrets) != 1 || p.Spec.ImagePullSecrets[0].Name != "regcred" {
			t.Errorf("canary pull secrets %v, want the release's [regcred]", p.Spec.ImagePullSecrets)
		}
	})
	go a.Run(ctx)
	c := waitFailClosedFalse(t, client, 20*time.Second)
	if c == nil || c.Status != corev1.ConditionFalse || c.Reason != names.ReasonCanaryImageNotPulled ||
		!strings.Contains(c.Message, "401 Unauthorized") || !strings.Contains(c.Message, "imagePullSecrets regcred") || len(c.Message) > kubeevents.MaxMessage {
		t.Fatalf("condition %+v: want False/%s naming the kubelet's pull error and the Secret it carried (regcred)", c, names.ReasonCanaryImageNotPulled)
	}
}

// TestOldRuntimeIsFailOpenWithoutACanary: when the NRI plugin reports a runtime without
// validators (containerd 2.1 embeds NRI v0.8), the node is fail-open whatever the canary would
// show, and the condition names the runtime and the fix; no canary pod is created.
func TestOldRuntimeIsFailOpenWithoutACanary(t *testing.T) {
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-node01"}})
	n := names.Default()
	state := filepath.Join(t.TempDir(), "nri-state.json")
	why := "runtime containerd v2.1.4 embeds NRI v0.8.0, which has no validators: …; upgrade to containerd 2.2 or later"
	if _, err := nristate.Write(state, nristate.Doc{Generation: 1, Runtime: &nristate.Runtime{Name: "containerd", Version: "v2.1.4", NRIVersion: "v0.8.0", Why: why}}); err != nil {
		t.Fatal(err)
	}
	a := New(Options{Names: n, Node: "gpu-node01", Source: &flakySource{top: seed(t)}, Client: client, Period: time.Hour, Log: logr.Discard(), Metrics: newMetrics(), NRIStateFile: state,
		Canary: CanaryOptions{Image: "ghcr.io/nvdomain/nvdomain:v1", Namespace: "nvdomain-system", NamePrefix: "nvdomain-canary-", Interval: time.Hour, Timeout: 20 * time.Second, WithholdCapacity: true}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go a.Run(ctx)
	c := waitFailClosedFalse(t, client, 15*time.Second)
	if c == nil || c.Status != corev1.ConditionFalse || c.Reason != names.ReasonRuntimeWithoutValidator || c.Message != why {
		t.Fatalf("condition %+v: want False/%s with the plugin's reason", c, names.ReasonRuntimeWithoutValidator)
	}
	for _, act := range client.Actions() {
		if act.GetResource().Resource == "pods" && act.GetVerb() == "create" {
			t.Fatalf("a canary pod was created: %v", act)
		}
	}
}

// TestRuntimeDowngradeTurnsTheNodeFailOpenAtOnce: without a canary configured, a state file
// that starts reporting a runtime without validators (containerd replaced by an older one)
// turns the node fail-open at the next poll, and back to Unknown when it validates again.
func TestRuntimeDowngradeTurnsTheNodeFailOpenAtOnce(t *testing.T) {
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-node01"}})
	n := names.Default()
	state := filepath.Join(t.TempDir(), "nri-state.json")
	write := func(gen int64, failClosed bool) {
		r := &nristate.Runtime{Name: "containerd", Version: "v2.4.2", NRIVersion: "v0.11.0", FailClosed: true}
		if !failClosed {
			r = &nristate.Runtime{Name: "containerd", Version: "v2.1.4", NRIVersion: "v0.8.0", Why: "upgrade to containerd 2.2 or later"}
		}
		if _, err := nristate.Write(state, nristate.Doc{Generation: gen, Runtime: r}); err != nil {
			t.Fatal(err)
		}
	}
	write(1, true)
	a := New(Options{Names: n, Node: "gpu-node01", Source: &flakySource{top: seed(t)}, Client: client, Period: time.Hour, Log: logr.Discard(), Metrics: newMetrics(),
		NRIStateFile: state, StatePoll: 20 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go a.Run(ctx)
	wait := func(status corev1.ConditionStatus, reason string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			if c := condition(t, client, names.ConditionFailClosed); c != nil && c.Status == status && c.Reason == reason {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatalf("condition %+v, want %s/%s", condition(t, client, names.ConditionFailClosed), status, reason)
	}
	time.Sleep(200 * time.Millisecond)
	if c := condition(t, client, names.ConditionFailClosed); c != nil {
		t.Fatalf("a validating runtime set %+v", c)
	}
	write(2, false)
	wait(corev1.ConditionFalse, names.ReasonRuntimeWithoutValidator)
	// A restarted plugin writes its state before it registers: no runtime known yet. The
	// node stays fail-open.
	if _, err := nristate.Write(state, nristate.Doc{Generation: 3}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if c := condition(t, client, names.ConditionFailClosed); c == nil || c.Reason != names.ReasonRuntimeWithoutValidator {
		t.Fatalf("a state file without a runtime changed the verdict: %+v", c)
	}
	write(4, true)
	wait(corev1.ConditionUnknown, "RuntimeValidates")
}

// A node is drained for an uninstall only when a plugin that has synchronized with the
// runtime says pass-through with no pod requiring it: a missing file (a reboot emptied /run)
// or a restarted plugin that has not synchronized yet counts no pod and proves nothing.
func TestDrainedNeedsASynchronizedPlugin(t *testing.T) {
	state := filepath.Join(t.TempDir(), "nri-state.json")
	a := New(Options{Names: names.Default(), Node: "gpu-node01", NRIStateFile: state, Log: logr.Discard(), Metrics: newMetrics()})
	for i, tc := range []struct {
		doc  *nristate.Doc
		want bool
	}{
		{nil, false},
		{&nristate.Doc{PassThrough: true}, false},
		{&nristate.Doc{PassThrough: true, Synchronized: true, RequiringPods: 1}, false},
		{&nristate.Doc{PassThrough: true, Synchronized: true}, true},
	} {
		if tc.doc != nil {
			tc.doc.Generation = int64(i + 1)
			if _, err := nristate.Write(state, *tc.doc); err != nil {
				t.Fatal(err)
			}
		}
		if got := a.drained(); got != tc.want {
			t.Errorf("%+v: drained %v, want %v", tc.doc, got, tc.want)
		}
	}
}

// Without a canary (node.failClosedCanary off, or no policies) the gauge says "not run" (-1),
// not the zero a gauge starts at, which NvdomainNodeFailsOpen would read as a canary that
// started on every node.
func TestNoCanaryIsNotFailOpenInTheMetric(t *testing.T) {
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-node01"}})
	m := newMetrics()
	a := New(Options{Names: names.Default(), Node: "gpu-node01", Source: &flakySource{top: seed(t)}, Client: client, Period: time.Hour, Log: logr.Discard(), Metrics: m})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go a.Run(ctx)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && testutil.ToFloat64(m.FailClosed) != -1 {
		time.Sleep(10 * time.Millisecond)
	}
	if v := testutil.ToFloat64(m.FailClosed); v != -1 {
		t.Errorf("nvdomain_agent_fail_closed = %v without a canary, want -1", v)
	}
}

// waitFailClosedFalse waits until the node's NvdomainFailClosed condition is False and returns
// it (or the last one seen, for the caller's message).
func waitFailClosedFalse(t *testing.T, client *fake.Clientset, timeout time.Duration) *corev1.NodeCondition {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var c *corev1.NodeCondition
	for time.Now().Before(deadline) {
		if c = condition(t, client, names.ConditionFailClosed); c != nil && c.Status == corev1.ConditionFalse {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return c
}

// fakeCanaryKubelet plays gpu-node01's kubelet until ctx ends: each new canary pod is passed to
// check, then given one container in state.
func fakeCanaryKubelet(ctx context.Context, client *fake.Clientset, state corev1.ContainerState, check func(*corev1.Pod)) {
	go func() {
		for ctx.Err() == nil {
			p, err := client.CoreV1().Pods("nvdomain-system").Get(ctx, "nvdomain-canary-gpu-node01", metav1.GetOptions{})
			if err == nil && len(p.Status.ContainerStatuses) == 0 {
				check(p)
				p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "canary", State: state}}
				client.CoreV1().Pods("nvdomain-system").UpdateStatus(ctx, p, metav1.UpdateOptions{})
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
}

// TestAFreshNodeOffersRoomOnlyOnceProven: under require-fail-closed, a node no canary was
// refused on yet (an autoscaler's fresh node) publishes its domains with no room, so no
// tensor-parallel pod lands there before containerd is proven to enforce NRI's required
// plugins; the first refused canary gives every domain its room. An agent that restarts on a
// node its predecessor proved keeps the room from the start.
func TestAFreshNodeOffersRoomOnlyOnceProven(t *testing.T) {
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-node01"}, Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{BootID: "boot-1"}}})
	n := names.Default()
	opts := Options{Names: n, Node: "gpu-node01", Source: &flakySource{top: seed(t)}, Client: client, Period: time.Hour, Log: logr.Discard(), Metrics: newMetrics(),
		Canary: CanaryOptions{Image: "ghcr.io/nvdomain/nvdomain:v1", Namespace: "nvdomain-system", NamePrefix: "nvdomain-canary-", Interval: time.Hour, Timeout: 20 * time.Second, WithholdCapacity: true}}
	room := func() (int64, bool) {
		node, _ := client.CoreV1().Nodes().Get(context.Background(), "gpu-node01", metav1.GetOptions{})
		q, ok := node.Status.Capacity[corev1.ResourceName(n.DomainResource(0))]
		return q.Value(), ok
	}
	waitRoom := func(want int64) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for time.Now().Before(deadline) {
			if r, ok := room(); ok && r == want {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		r, ok := room()
		t.Fatalf("domain 0 room %d (published %v), want %d", r, ok, want)
	}
	ctx, cancel := context.WithCancel(context.Background())
	a := New(opts)
	go a.Run(ctx)
	// Published, canary pending (no kubelet answers yet): no room, and the annotation says
	// not proven (always written, so that its absence means an older release).
	waitRoom(0)
	if node, _ := client.CoreV1().Nodes().Get(ctx, "gpu-node01", metav1.GetOptions{}); node.Annotations[n.FailClosedProvenAnnotation()] != names.NotProven {
		t.Errorf("annotations %v: want %s=%s on a node not proven", node.Annotations, n.FailClosedProvenAnnotation(), names.NotProven)
	}
	time.Sleep(300 * time.Millisecond)
	if r, _ := room(); r != 0 {
		t.Fatalf("room %d before any canary was decided, want 0", r)
	}
	// containerd's validator refuses the canary: proven, room published.
	fakeCanaryKubelet(ctx, client, corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CreateContainerError",
		Message: `failed to create containerd container: validation error: required plugin "nvdomain-canary-absent" not present`}}, func(*corev1.Pod) {})
	waitRoom(4)
	if node, _ := client.CoreV1().Nodes().Get(ctx, "gpu-node01", metav1.GetOptions{}); node.Labels[n.FailOpenLabel()] != "" {
		t.Errorf("labels %v: a proven node carries no fail-open label", node.Labels)
	} else if v, ok := node.Annotations[n.FailClosedProvenAnnotation()]; !ok || v != "boot-1" {
		t.Errorf("annotations %v: want the proof %s=boot-1 (the node's boot ID)", node.Annotations, n.FailClosedProvenAnnotation())
	}
	cancel()

	// A new agent on the proven node: room from its first publish, before its own canary
	// (none answers now).
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	opts.Metrics = newMetrics()
	b := New(opts)
	go b.Run(ctx2)
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if r, _ := room(); r != 4 {
			t.Fatalf("room %d after the agent restarted on a proven node, want 4 throughout", r)
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel2()

	// The node rebooted (another boot ID; its containerd may have come up without the
	// snippet): the proof no longer stands, and no canary answers.
	node, _ := client.CoreV1().Nodes().Get(context.Background(), "gpu-node01", metav1.GetOptions{})
	node.Status.NodeInfo.BootID = "boot-2"
	if _, err := client.CoreV1().Nodes().UpdateStatus(context.Background(), node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	ctx3, cancel3 := context.WithCancel(context.Background())
	defer cancel3()
	opts.Metrics = newMetrics()
	go New(opts).Run(ctx3)
	waitRoom(0)
	node, _ = client.CoreV1().Nodes().Get(context.Background(), "gpu-node01", metav1.GetOptions{})
	if v := node.Annotations[n.FailClosedProvenAnnotation()]; v != names.NotProven {
		t.Errorf("annotations %v: the proof of another boot must give way to %s=%s", node.Annotations, n.FailClosedProvenAnnotation(), names.NotProven)
	}
}

func TestPullFailureMessageKeepsTheCause(t *testing.T) {
	cause := `failed to resolve image: unexpected status from HEAD request to https://registry.corp/v2/gpu/nvdomain/manifests/v1: 401 Unauthorized`
	for _, tc := range []struct {
		name    string
		o       CanaryOptions
		failure string
	}{
		{"short", CanaryOptions{Image: "registry.corp/gpu/nvdomain:v1", PullSecrets: []string{"regcred"}, Timeout: time.Minute, Namespace: "nvdomain-system"}, "ErrImagePull: " + cause},
		{"a long kubelet error", CanaryOptions{Image: "registry.corp/gpu/nvdomain:v1", PullSecrets: []string{"regcred"}, Timeout: time.Minute, Namespace: "nvdomain-system"},
			"ImagePullBackOff: " + strings.Repeat(`Back-off pulling image "registry.corp/gpu/nvdomain:v1": `, 8) + cause},
		{"a digest reference and many Secrets", CanaryOptions{Image: "registry.corp/a/very/deep/path/of/mirrors/gpu/nvdomain@sha256:" + strings.Repeat("0123456789abcdef", 4),
			PullSecrets: []string{strings.Repeat("s", 60), strings.Repeat("t", 60), strings.Repeat("u", 60), "regcred"}, Timeout: time.Minute, Namespace: "nvdomain-system"}, "ErrImagePull: " + cause},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := pullFailureMessage(tc.o, tc.failure)
			if len(m) > kubeevents.MaxMessage || !strings.HasSuffix(m, "401 Unauthorized") || !strings.HasPrefix(m, "the canary's image") {
				t.Errorf("message (%d bytes) %q: want at most %d bytes, the fix first and the kubelet's cause last", len(m), m, kubeevents.MaxMessage)
			}
		})
	}
}

// TestTheProofIsTrustedOnlyFromItsOwnBoot: the seed takes room from a proof only when it names
// this boot, and from a True condition only when no annotation is there at all (a node last
// published by a release that wrote none); a True left over from before the canary was turned
// off (annotation "no") proves nothing.
func TestTheProofIsTrustedOnlyFromItsOwnBoot(t *testing.T) {
	n := names.Default()
	trueCond := []corev1.NodeCondition{{Type: names.ConditionFailClosed, Status: corev1.ConditionTrue, Reason: "CanaryRefused"}}
	for _, tc := range []struct {
		name       string
		boot       string
		annotation *string
		conds      []corev1.NodeCondition
		want       bool
	}{
		{"this boot's proof", "b1", ptr.To("b1"), nil, true},
		{"another boot's proof", "b2", ptr.To("b1"), trueCond, false},
		{"not proven, True left from before the canary was off", "b1", ptr.To(names.NotProven), trueCond, false},
		{"an older release's True, no annotation", "b1", nil, trueCond, true},
		{"a fresh node", "b1", nil, nil, false},
		{"no boot ID: a proof cannot be tied to a boot", "", ptr.To(""), nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-node01", Annotations: map[string]string{}},
				Status: corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{BootID: tc.boot}, Conditions: tc.conds}}
			if tc.annotation != nil {
				node.Annotations[n.FailClosedProvenAnnotation()] = *tc.annotation
			}
			a := New(Options{Names: n, Node: "gpu-node01", Client: fake.NewClientset(node), Log: logr.Discard(), Metrics: newMetrics(),
				Canary: CanaryOptions{Image: "ghcr.io/nvdomain/nvdomain:v1", WithholdCapacity: true}})
			a.seedFailOpen(context.Background())
			if a.proven != tc.want {
				t.Errorf("proven %v, want %v", a.proven, tc.want)
			}
		})
	}
}

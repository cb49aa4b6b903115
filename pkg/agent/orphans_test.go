package agent

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nvdomain/nvdomain/pkg/nristate"
)

// Review classic H3: a TP pod is force-deleted while its process hangs in the driver. The
// scheduler stops counting its GPUs, but the container lives on and the NRI plugin keeps
// them, so every pod the scheduler sends to that domain is refused, and a refused pod moved
// away would be sent straight back. The agent leaves the GPUs of pinned containers whose pod
// the scheduler no longer counts (gone, replaced under the same name, finished, or bound
// elsewhere) out of the node's room, and counts them again once the API says otherwise.
func TestGPUsOfPodsTheSchedulerNoLongerCountsLeaveTheRoom(t *testing.T) {
	pod := func(name, uid, node string, phase corev1.PodPhase) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID(uid)}, Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: phase}}
	}
	cases := []struct {
		name string
		pod  *corev1.Pod // the API's pod named like the holder's; nil: none
		room int64       // domain 0's published room; the holder holds 4 of its 4 GPUs
	}{
		{"the pod runs", pod("tp", "uid-tp", "gpu-a", corev1.PodRunning), 4},
		{"the pod was force-deleted", nil, 0},
		{"another pod of the same name", pod("tp", "uid-other", "gpu-a", corev1.PodPending), 0},
		{"the pod finished", pod("tp", "uid-tp", "gpu-a", corev1.PodFailed), 0},
		{"the pod is bound elsewhere", pod("tp", "uid-tp", "gpu-b", corev1.PodRunning), 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			state := filepath.Join(t.TempDir(), "nri-state.json")
			doc := nristate.Doc{Generation: 1, Synchronized: true, Assignments: []nristate.Assignment{
				{ContainerID: "c1", PodNamespace: "default", PodName: "tp", PodUID: "uid-tp", ContainerName: "vllm", GPUs: []int{0, 1, 2, 3}, Domain: 0},
			}}
			if _, err := nristate.Write(state, doc); err != nil {
				t.Fatal(err)
			}
			client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "gpu-a"}})
			if tc.pod != nil {
				if _, err := client.CoreV1().Pods("default").Create(context.Background(), tc.pod, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			m, err := NewMetrics(prometheus.NewRegistry())
			if err != nil {
				t.Fatal(err)
			}
			a := New(Options{Names: n, Node: "gpu-a", Client: client, NRIStateFile: state, Log: logr.Discard(), Metrics: m})
			a.lastGood = topologyOf(t, 8, []int{0, 1, 2, 3}, []int{4, 5, 6, 7})
			a.readNRIState()
			changed := a.checkHolders(context.Background())
			if changed != (tc.room == 0) {
				t.Errorf("checkHolders reported a change: %v", changed)
			}
			d, err := Desire(n, a.lastGood, a.unpinned, Health{})
			if err != nil {
				t.Fatal(err)
			}
			if got := d.Capacity[n.DomainResource(0)]; got != tc.room {
				t.Fatalf("domain 0's room = %d, want %d", got, tc.room)
			}
			if got := d.Capacity[n.DomainResource(1)]; got != 4 {
				t.Fatalf("domain 1's room = %d, want 4", got)
			}
			if tc.room == 0 {
				// The pod comes back as the scheduler counts it (a same-named pod is not the
				// holder's, so recreate it with the holder's UID): after HolderRecheck its GPUs
				// count as the scheduler's again.
				_ = client.CoreV1().Pods("default").Delete(context.Background(), "tp", metav1.DeleteOptions{})
				if _, err := client.CoreV1().Pods("default").Create(context.Background(), pod("tp", "uid-tp", "gpu-a", corev1.PodRunning), metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
				c := a.holderChecks["uid-tp"]
				c.at = c.at.Add(-HolderRecheck)
				a.holderChecks["uid-tp"] = c
				if !a.checkHolders(context.Background()) || a.unpinned[0] != 0 {
					t.Fatalf("the holder's pod is back, yet domain 0 still leaves out %d GPUs", a.unpinned[0])
				}
			}
		})
	}
}

package nriplugin

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
)

func TestKubeReporterAnnotatesPodsAndRecordsEvents(t *testing.T) {
	client := fake.NewClientset(
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "tp", Namespace: "default", UID: "uid-tp"}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "multi", Namespace: "default", UID: "uid-multi"}},
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := NewKubeReporter(ctx, client, n, "gpu-node01", logr.Discard())
	r.Assigned(Assignment{PodNamespace: "default", PodName: "tp", PodUID: "uid-tp", ContainerName: "vllm", GPUs: []int{4, 5}, Domain: 1}, false)
	r.Assigned(Assignment{PodNamespace: "default", PodName: "multi", PodUID: "uid-multi", ContainerName: "a", GPUs: []int{0, 1}, Domain: 0}, false)
	r.Assigned(Assignment{PodNamespace: "default", PodName: "multi", PodUID: "uid-multi", ContainerName: "b", GPUs: []int{2, 3}, Domain: 0}, false)
	r.Assigned(Assignment{PodNamespace: "default", PodName: "ghost", PodUID: "uid-ghost", ContainerName: "c", GPUs: []int{6}, Domain: -1}, true)

	annotation := func(name string) string {
		p, err := client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return ""
		}
		return p.Annotations["gpu.nvidia.com/assigned-gpus"]
	}
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		evs, _ := client.CoreV1().Events("default").List(ctx, metav1.ListOptions{})
		return annotation("tp") == "4,5" && annotation("multi") == `{"a":"0,1","b":"2,3"}` && len(evs.Items) == 4, nil
	})
	if err != nil {
		evs, _ := client.CoreV1().Events("default").List(ctx, metav1.ListOptions{})
		t.Fatalf("tp=%q multi=%q events=%d", annotation("tp"), annotation("multi"), len(evs.Items))
	}
	evs, _ := client.CoreV1().Events("default").List(ctx, metav1.ListOptions{})
	warned := false
	for _, e := range evs.Items {
		if e.Reason == "TensorParallelNotPinned" && e.Type == corev1.EventTypeWarning && e.InvolvedObject.Name == "ghost" {
			warned = true
		}
	}
	if !warned {
		t.Errorf("no TensorParallelNotPinned warning among %d events", len(evs.Items))
	}
	// The pod that does not exist got its Event but no annotation, and nothing blocked.
	if annotation("ghost") != "" {
		t.Error("annotated a pod that does not exist")
	}
}

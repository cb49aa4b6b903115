package repin

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvdomain/nvdomain/pkg/placement"
)

// Every text a user reads about a pod that waits names the cause and the fixes: room in a
// domain (scale down, free a domain) or a smaller tensor-parallel size.
func TestAdviceNamesCauseAndFix(t *testing.T) {
	dec := placement.RepinDecision{From: 2, To: 5, Node: "gpu-7"}
	chain := OwnerVerdict{Chain: []metav1.OwnerReference{{Kind: "StatefulSet", Name: "lws-0"}, {Kind: "LeaderWorkerSet", Name: "lws"}}}
	job := OwnerVerdict{Chain: []metav1.OwnerReference{{Kind: "Job", Name: "train"}}}
	cases := []struct {
		name string
		text string
		want []string
		not  []string
	}{
		{"stranded cause", StrandedCause(dec, 8, 0),
			[]string{"pinned NVSwitch domain 2 is full", "has 8 GPUs of domain 2 free", "domain 5 has room for it on node gpu-7"}, []string{"(for "}},
		{"stranded bare pod", StrandedFix(dec, true),
			[]string{"Fix: delete the pod and create it again from its original manifest", "free domain 2 (scale down or delete the pods", "lower the pod's tensor-parallel size", "podFailurePolicy ignores DisruptionTarget"}, []string{"kubectl replace --force"}},
		{"stranded pod whose owners nvdomain does not trust", SkipFix(chain, dec),
			[]string{"Fix: if its StatefulSet lws-0 (of LeaderWorkerSet lws) takes a restart of this pod, delete the pod", "free domain 2", "lower the pod's tensor-parallel size"}, nil},
		{"a Job's pod: deleting it costs a retry", SkipFix(job, dec),
			[]string{"Fix: free domain 2", "lower the pod's tensor-parallel size"}, []string{"delete the pod;", "delete the pod:"}},
		{"no room anywhere", NoRoomAdvice(2, 8),
			[]string{"no NVSwitch domain has room for 8 GPUs", "free 8 GPUs of domain 2, or of any domain of at least 8 GPUs", "scale down or delete the pods there", "lower the pod's tensor-parallel size"}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, w := range tc.want {
				if !strings.Contains(tc.text, w) {
					t.Errorf("lacks %q: %q", w, tc.text)
				}
			}
			for _, w := range tc.not {
				if strings.Contains(tc.text, w) {
					t.Errorf("says %q: %q", w, tc.text)
				}
			}
		})
	}
}

func TestOwnerVerdictDescribe(t *testing.T) {
	cases := []struct {
		chain []metav1.OwnerReference
		want  string
	}{
		{nil, "no owner"},
		{[]metav1.OwnerReference{{Kind: "ReplicaSet", Name: "rs"}}, "ReplicaSet rs"},
		{[]metav1.OwnerReference{{Kind: "Job", Name: "j"}, {Kind: "CronJob", Name: "c"}, {Kind: "Pipeline", Name: "p"}}, "Job j (of CronJob c (of Pipeline p))"},
	}
	for _, tc := range cases {
		if got := (OwnerVerdict{Chain: tc.chain}).Describe(); got != tc.want {
			t.Errorf("Describe(%v) = %q, want %q", tc.chain, got, tc.want)
		}
	}
}

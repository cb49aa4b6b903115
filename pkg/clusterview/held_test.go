package clusterview

import (
	"testing"

	"github.com/nvdomain/nvdomain/pkg/rules"
)

// The domain resource a pod holds, counted as the scheduler counts requests.
func TestDomainHeldCountsAsTheScheduler(t *testing.T) {
	main := func(k int) rules.Container { return rules.Container{DomainGPUs: k} }
	initC := func(k int) rules.Container { return rules.Container{Init: true, DomainGPUs: k} }
	side := func(k int) rules.Container { return rules.Container{Sidecar: true, DomainGPUs: k} }
	cases := []struct {
		name string
		cs   []rules.Container
		want int
	}{
		{"containers add up", []rules.Container{main(2), main(2)}, 4},
		{"a bigger init container", []rules.Container{initC(8), main(4)}, 8},
		{"a sidecar beside the containers", []rules.Container{side(2), main(4)}, 6},
		{"an init container after a sidecar", []rules.Container{side(2), initC(4), main(1)}, 6},
		{"an init container before the sidecar", []rules.Container{initC(4), side(2), main(1)}, 4},
	}
	for _, tc := range cases {
		if got := domainHeld(rules.Pod{Containers: tc.cs}); got != tc.want {
			t.Errorf("%s: domainHeld = %d, want %d", tc.name, got, tc.want)
		}
	}
}

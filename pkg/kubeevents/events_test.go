package kubeevents

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestCap(t *testing.T) {
	for _, tc := range []struct {
		name string
		msg  string
		cut  bool
	}{
		{"short", "metadata.labels[tensor-parallel]: use \"true\"", false},
		{"exactly the cap", strings.Repeat("a", MaxMessage), false},
		{"long", "spec.containers[0].resources: ask for 4 GPUs; " + strings.Repeat("detail ", 100), true},
		{"multi-byte at the cut", strings.Repeat("→", 300), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Cap(tc.msg)
			if !tc.cut {
				if got != tc.msg {
					t.Errorf("Cap changed a message within the cap: %q", got)
				}
				return
			}
			if len(got) > MaxMessage || !utf8.ValidString(got) || !strings.HasSuffix(got, capSuffix) {
				t.Errorf("Cap = %q (%d bytes): want at most %d valid UTF-8 bytes ending in %q", got, len(got), MaxMessage, capSuffix)
			}
			if !strings.HasPrefix(tc.msg, strings.TrimSuffix(got, capSuffix)) {
				t.Errorf("Cap kept %q, not the message's start (the field and the fix come first)", got)
			}
		})
	}
}

package integration

import (
	"os"
	"testing"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/nvdomain/nvdomain/test/netns"
)

func runMain(m *testing.M) {
	// The whole package runs in a private network namespace when it can, so the tests of
	// several webhook replicas behind a Service have addresses to give them (see test/netns).
	if code, reexecuted := netns.Enter(); reexecuted {
		os.Exit(code)
	}
	// controller-runtime complains on stderr when its global logger is never set.
	ctrllog.SetLogger(logr.Discard())
	os.Exit(m.Run())
}

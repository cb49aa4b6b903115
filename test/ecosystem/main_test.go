package ecosystem

import (
	"os"
	"testing"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/nvdomain/nvdomain/test/netns"
)

func TestMain(m *testing.M) {
	// The webhook replicas and the webhooks of Kueue and LeaderWorkerSet need addresses outside loopback for their
	// EndpointSlices (see test/netns): the whole package runs in a private network namespace.
	if code, reexecuted := netns.Enter(); reexecuted {
		os.Exit(code)
	}
	ctrllog.SetLogger(logr.Discard())
	os.Exit(m.Run())
}

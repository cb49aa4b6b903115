package integration

import (
	"os"
	"testing"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

func runMain(m *testing.M) {
	// controller-runtime complains on stderr when its global logger is never set.
	ctrllog.SetLogger(logr.Discard())
	os.Exit(m.Run())
}

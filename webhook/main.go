package webhook

import (
	"flag"
	"fmt"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/nvdomain/nvdomain/pkg/version"
)

// Main is the whole of a webhook process: the command line's flags (flag.CommandLine, where
// controller-runtime registers --kubeconfig), the manager, and a graceful run until SIGTERM. adjust, when not nil, changes the parsed options before the manager is
// built; test/noopwebhook uses it to serve the same process with handlers that allow
// everything, so benchmarks compare like with like.
func Main(adjust func(*ServerOptions)) error {
	so := DefaultServerOptions()
	complete := so.AddFlags(flag.CommandLine)
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	if err := complete(); err != nil {
		return err
	}
	if adjust != nil {
		adjust(&so)
	}
	log := zap.New(zap.UseFlagOptions(&zapOpts))
	ctrl.SetLogger(log)
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	mgr, _, err := NewManager(cfg, so, log)
	if err != nil {
		return err
	}
	log.Info("starting", "version", version.Version, "options", so.Summary(), "override", so.AdmissionOverride != nil)
	return RunGracefully(ctrl.SetupSignalHandler(), mgr, so.Drain, so.ShutdownDelay, log)
}

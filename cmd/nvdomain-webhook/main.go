// Command nvdomain-webhook serves nvdomain's mutating and validating admission webhook and,
// on the elected replica, the re-pin controller. See package webhook.
package main

import (
	"flag"
	"fmt"
	"os"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/nvdomain/nvdomain/webhook"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "nvdomain-webhook: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	so := webhook.DefaultServerOptions()
	complete := so.AddFlags(flag.CommandLine)
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	if err := complete(); err != nil {
		return err
	}
	log := zap.New(zap.UseFlagOptions(&zapOpts))
	ctrl.SetLogger(log)
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	mgr, _, err := webhook.NewManager(cfg, so, log)
	if err != nil {
		return err
	}
	log.Info("starting", "options", so.Summary())
	return webhook.RunGracefully(ctrl.SetupSignalHandler(), mgr, so.Drain, so.ShutdownDelay, log)
}

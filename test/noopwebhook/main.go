// Command noopwebhook is nvdomain-webhook with admission handlers that allow every request
// unchanged: the same flags, manager, informers, TLS serving, readiness and graceful
// shutdown, built the same way. The benchmarks register it behind the same Service with the
// same webhook configurations as nvdomain, so that comparing the two measures what
// nvdomain's admission itself costs (docs/benchmarks.md). Not for clusters.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/nvdomain/nvdomain/webhook"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "noopwebhook: %v\n", err)
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
	so.AdmissionOverride = admission.HandlerFunc(func(context.Context, admission.Request) admission.Response {
		return admission.Allowed("")
	})
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
	log.Info("starting (no-op admission)", "options", so.Summary())
	return webhook.RunGracefully(ctrl.SetupSignalHandler(), mgr, so.Drain, so.ShutdownDelay, log)
}

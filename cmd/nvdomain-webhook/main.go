// Command nvdomain-webhook serves nvdomain's mutating and validating admission webhook.
// See package webhook.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/webhook"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "nvdomain-webhook: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	so := webhook.ServerOptions{Handlers: webhook.DefaultOptions()}
	var tpSizes, nonTP, excluded string
	flag.StringVar(&so.CertDir, "cert-dir", "/etc/nvdomain/tls", "directory with tls.crt and tls.key (watched for rotation)")
	flag.StringVar(&so.Host, "host", "", "address to serve the webhook on (empty: all interfaces)")
	flag.IntVar(&so.Port, "port", 9443, "webhook port")
	flag.StringVar(&so.MetricsAddr, "metrics-bind-address", ":8080", "Prometheus metrics address; 0 disables")
	flag.StringVar(&so.ProbeAddr, "health-probe-bind-address", ":8081", "healthz/readyz address")
	flag.StringVar(&tpSizes, "tp-sizes", "2,4,8,16,32,64,128,256", "allowed tensor-parallel sizes")
	flag.StringVar(&nonTP, "non-tp-pods", string(webhook.NonTPAuto), "what to do with GPU pods that are not tensor-parallel: pin, account or auto")
	flag.StringVar(&excluded, "exclude-namespaces", "kube-system", "comma-separated namespaces never touched (add the webhook's own)")
	namesFromFlags := names.BindFlags(flag.CommandLine)
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()

	var err error
	if so.Handlers.AllowedTPSizes, err = webhook.ParseTPSizes(tpSizes); err != nil {
		return err
	}
	if so.Handlers.NonTPPods, err = webhook.ParseNonTPMode(nonTP); err != nil {
		return err
	}
	if so.Handlers.Names, err = namesFromFlags(); err != nil {
		return err
	}
	so.Handlers.ExcludedNamespaces = nil
	for _, ns := range strings.Split(excluded, ",") {
		if ns = strings.TrimSpace(ns); ns != "" {
			so.Handlers.ExcludedNamespaces = append(so.Handlers.ExcludedNamespaces, ns)
		}
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
	log.Info("serving", "port", so.Port, "nonTPPods", so.Handlers.NonTPPods, "tpSizes", so.Handlers.AllowedTPSizes)
	return mgr.Start(ctrl.SetupSignalHandler())
}

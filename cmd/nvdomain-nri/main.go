// Command nvdomain-nri is nvdomain's containerd NRI plugin: it gives each GPU container the
// exact GPUs of its pod's NVSwitch domain. It runs as an external plugin (a DaemonSet with the
// NRI socket mounted) or pre-installed in containerd's plugin_path. See package nriplugin.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/nvdomain/nvdomain/nri-plugin"
	"github.com/nvdomain/nvdomain/pkg/names"
)

func main() {
	options := nriplugin.BindFlags(flag.CommandLine)
	namesFromFlags := names.BindFlags(flag.CommandLine)
	zo := zap.Options{}
	zo.BindFlags(flag.CommandLine)
	flag.Parse()

	log := zap.New(zap.UseFlagOptions(&zo)).WithName("nvdomain-nri")
	err := func() error {
		o, err := options(log)
		if err != nil {
			return err
		}
		if o.Names, err = namesFromFlags(); err != nil {
			return err
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		return nriplugin.Run(ctx, o, log)
	}()
	if err != nil {
		fmt.Fprintf(os.Stderr, "nvdomain-nri: %v\n", err)
		os.Exit(1)
	}
}

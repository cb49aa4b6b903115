// Command nvdomain-fleet publishes every node of a simulated topology from one process, for
// fake nodes (kwok's) in the scale runs (test/scale). Test scaffolding, not shipped.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/test/fleet"
)

func main() {
	var o fleet.Options
	o.AddFlags(flag.CommandLine)
	namesFromFlags := names.BindFlags(flag.CommandLine)
	zo := zap.Options{}
	zo.BindFlags(flag.CommandLine)
	flag.Parse()
	log := zap.New(zap.UseFlagOptions(&zo)).WithName("nvdomain-fleet")
	var err error
	if o.Names, err = namesFromFlags(); err == nil {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err = fleet.Run(ctx, o, log)
		stop()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "nvdomain-fleet: %v\n", err)
		os.Exit(1)
	}
}

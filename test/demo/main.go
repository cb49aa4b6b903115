// Command demo is `make demo`: a real single-node cluster on this machine, nvdomain installed
// with its Helm chart in simulated mode, the seed scenarios applied with kubectl from
// manifests/examples, and a readable report. KEEP=1 leaves the cluster up.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/nvdomain/nvdomain/test/localcluster"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	c, err := localcluster.Start(ctx, localcluster.Options{Log: os.Stderr, Keep: os.Getenv("KEEP") == "1"})
	if err != nil {
		return err
	}
	defer c.Stop()
	if err := c.Install(ctx, os.Stdout); err != nil {
		return err
	}
	rep, err := c.RunScenarios(ctx, os.Stdout)
	if err != nil {
		return err
	}
	d2, err := c.RunDay2(ctx, os.Stdout, rep)
	if err != nil {
		return err
	}
	ns, err := c.RunNodeSide(ctx, os.Stdout, rep)
	if err != nil {
		return err
	}
	rep.Write(os.Stdout)
	d2.Write(os.Stdout)
	ns.Write(os.Stdout)
	return nil
}

// Command demo is `make demo`: a real single-node cluster on this machine, nvdomain installed
// with its Helm chart in simulated mode, the seed scenarios applied with kubectl from
// manifests/examples, and a readable report. KEEP=1 leaves the cluster up; MODE=dra installs
// nvdomain as the node's DRA driver and runs the DRA-mode scenarios (docs/dra.md).
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
	if m := os.Getenv("MODE"); m != "" && m != "classic" && m != localcluster.ModeDRA {
		return fmt.Errorf("MODE=%s: use classic (the default) or dra", m)
	}
	c, err := localcluster.Start(ctx, localcluster.Options{Log: os.Stderr, Keep: os.Getenv("KEEP") == "1", Mode: os.Getenv("MODE")})
	if err != nil {
		return err
	}
	defer c.Stop()
	if err := c.Install(ctx, os.Stdout); err != nil {
		return err
	}
	if c.Mode() == localcluster.ModeDRA {
		rep, err := c.RunDRAScenarios(ctx, os.Stdout)
		if rep != nil && err == nil {
			rep.Write(os.Stdout)
		}
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

// Command kubectl-nvdomain is the nvdomain CLI as a kubectl plugin: with this binary on PATH,
// `kubectl nvdomain status` and `kubectl nvdomain explain POD` run it, with kubectl's
// --kubeconfig, --context and -n flags. It is the same command tree as cmd/nvdomain; see
// pkg/cli.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/nvdomain/nvdomain/pkg/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.KubectlPluginMain(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Command nvdomain is the operator CLI: topology discovery and parsing, the GPU Operator
// workload-config checker, and the cluster verbs status and explain. cmd/kubectl-nvdomain is
// the same command tree as a kubectl plugin. See pkg/cli.
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
	code := cli.Main(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Command nvdomain-nri-hook is the OCI createContainer hook nvdomain's NRI plugin adds to a
// container, to remove the device nodes of GPUs it must not have. It is installed on the node
// (the chart's DaemonSet copies it to a host directory), statically linked, because runc runs
// it from the host's filesystem. See package devhook.
package main

import (
	"fmt"
	"os"

	"github.com/nvdomain/nvdomain/nri-plugin/devhook"
)

func main() {
	if err := devhook.Run(os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "nvdomain-nri-hook: %v\n", err)
		os.Exit(1)
	}
}

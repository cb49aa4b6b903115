// Command nvdomain-webhook serves nvdomain's mutating and validating admission webhook and,
// on the elected replica, the re-pin controller. See package webhook.
package main

import (
	"fmt"
	"os"

	"github.com/nvdomain/nvdomain/webhook"
)

func main() {
	if err := webhook.Main(nil); err != nil {
		fmt.Fprintf(os.Stderr, "nvdomain-webhook: %v\n", err)
		os.Exit(1)
	}
}

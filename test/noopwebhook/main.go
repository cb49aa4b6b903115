// Command noopwebhook is nvdomain-webhook with admission handlers that allow every request
// unchanged: the same flags, manager, informers, TLS serving, readiness and graceful
// shutdown, built the same way. The benchmarks register it behind the same Service with the
// same webhook configurations as nvdomain, so that comparing the two measures what
// nvdomain's admission itself costs (docs/benchmarks.md). Not for clusters.
package main

import (
	"context"
	"fmt"
	"os"

	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/nvdomain/nvdomain/webhook"
)

func main() {
	allow := func(so *webhook.ServerOptions) {
		so.AdmissionOverride = admission.HandlerFunc(func(context.Context, admission.Request) admission.Response {
			return admission.Allowed("")
		})
	}
	if err := webhook.Main(allow); err != nil {
		fmt.Fprintf(os.Stderr, "noopwebhook: %v\n", err)
		os.Exit(1)
	}
}

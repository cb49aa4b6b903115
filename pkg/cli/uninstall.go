package cli

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/nvdomain/nvdomain/pkg/agent"
	"github.com/nvdomain/nvdomain/pkg/lifecycle"
	"github.com/nvdomain/nvdomain/pkg/names"
)

// newUninstall is the chart's pre-delete hook (charts/nvdomain/templates/uninstall.yaml); an
// operator who uninstalls with --no-hooks, or removed the chart's objects by hand, runs it
// before (docs/operations.md, Uninstall).
func newUninstall(f ClusterFactory, streams IOStreams) *cobra.Command {
	var (
		release string
		timeout time.Duration
	)
	gfs := flag.NewFlagSet("names", flag.ContinueOnError)
	buildNames := names.BindFlags(gfs)
	cmd := &cobra.Command{
		Use:   "uninstall --release NAME [-n NAMESPACE]",
		Short: "Take nvdomain out of admission and off every node, stranding no pod (helm uninstall runs it)",
		Long: `Runs the first steps of the uninstall protocol (docs/operations.md, Uninstall):

  1. deletes the release's webhook configurations and admission policies;
  2. marks the node DaemonSets: each node pod removes its node's labels, annotations, domain
     resources and conditions and the host files, and the NRI plugin turns pass-through so the
     pods admitted earlier (they require it) can still restart their containers;
  3. waits --timeout for clean nodes, then cleans what is left itself.

The node DaemonSets then delete themselves once no pod on any node requires the plugin.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if release == "" {
				return fmt.Errorf("--release is required: the Helm release name (helm list -A)")
			}
			n, err := buildNames()
			if err != nil {
				return err
			}
			c, err := f.Client()
			if err != nil {
				return err
			}
			ns, _, err := f.Namespace()
			if err != nil {
				return err
			}
			return lifecycle.Uninstall(cmd.Context(), lifecycle.UninstallOptions{
				Client: c, Names: n, Release: lifecycle.Release{Name: release, Namespace: ns}, Timeout: timeout, Out: streams.Out,
				HasState: agent.HasState(n),
				Clean: func(ctx context.Context, node string) error {
					p := agent.Publisher{Client: c, Names: n, Node: node}
					return p.Clear(ctx)
				},
			})
		},
	}
	cmd.Flags().StringVar(&release, "release", "", "the Helm release to uninstall")
	cmd.Flags().DurationVar(&timeout, "timeout", 2*time.Minute, "how long to wait for the node pods to clean their nodes before cleaning them from here")
	cmd.Flags().AddGoFlagSet(gfs)
	f.AddFlags(cmd.Flags())
	return cmd
}

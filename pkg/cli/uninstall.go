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
		release, job, argoNS string
		requireDeletion      bool
		timeout              time.Duration
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
			rel := lifecycle.Release{Name: release, Namespace: ns}
			if requireDeletion {
				deleting, why, err := lifecycle.ReleaseDeletion{REST: c.CoreV1().RESTClient(), Release: rel, Job: job, ArgoCDNamespace: argoNS}.Check(cmd.Context())
				if err != nil {
					return fmt.Errorf("cannot tell whether release %s is being deleted, so nothing was changed: %w", release, err)
				}
				if !deleting {
					fmt.Fprintf(streams.Out, "release %s is not being deleted (%s): nothing to do, and nothing was changed. "+
						"This Job was created by applying the chart's output without Helm (helm template | kubectl apply, Kustomize helmCharts). "+
						"To uninstall such an install, run `nvdomain uninstall --release %s -n %s` first, then delete the objects (docs/ecosystem.md, Argo CD)\n", release, why, release, ns)
					return nil
				}
				fmt.Fprintf(streams.Out, "release %s is being deleted: %s\n", release, why)
			}
			return lifecycle.Uninstall(cmd.Context(), lifecycle.UninstallOptions{
				Client: c, Names: n, Release: rel, Timeout: timeout, Out: streams.Out,
				HasState: agent.HasState(n),
				Clean: func(ctx context.Context, node string) error {
					p := agent.Publisher{Client: c, Names: n, Node: node}
					return p.Clear(ctx)
				},
			})
		},
	}
	cmd.Flags().StringVar(&release, "release", "", "the Helm release to uninstall")
	cmd.Flags().BoolVar(&requireDeletion, "require-deletion", false, "act only when the release is really being deleted (Helm installed it, or the Argo CD Application tracking --job is being deleted), else do nothing: the chart's hook sets it, so the hook applied without Helm cannot uninstall nvdomain")
	cmd.Flags().StringVar(&job, "job", "", "with --require-deletion: the hook Job's name, whose Argo CD tracking annotation names its Application")
	cmd.Flags().StringVar(&argoNS, "argocd-namespace", "argocd", "with --require-deletion: the namespace of Argo CD's Applications, for a tracking id that names no namespace (empty: Applications are not read)")
	cmd.Flags().DurationVar(&timeout, "timeout", 2*time.Minute, "how long to wait for the node pods to clean their nodes before cleaning them from here")
	cmd.Flags().AddGoFlagSet(gfs)
	f.AddFlags(cmd.Flags())
	return cmd
}

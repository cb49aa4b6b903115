package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/nvdomain/nvdomain/pkg/hostfiles"
)

// newNode is the chart's init-container step on each node: the release image has no shell,
// so copying the hook and the NRI snippet onto the host is a verb of this binary.
func newNode() *cobra.Command {
	cmd := &cobra.Command{Use: "node", Short: "Install nvdomain's files on a node's host filesystem (the chart's init containers run it)", Hidden: true}
	var (
		hookSrc, hookDir                             string
		snippet, confDir, hostConfDir, containerdCfg string
	)
	install := &cobra.Command{
		Use:   "install",
		Short: "Copy the OCI hook to --hook-dir and, with --conf-dir, containerd's NRI snippet",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			if hookDir != "" {
				if err := hostfiles.InstallHook(hookSrc, hookDir); err != nil {
					return fmt.Errorf("--hook-dir %s: %w", hookDir, err)
				}
				fmt.Fprintf(out, "installed the OCI hook in %s\n", hookDir)
			}
			if confDir == "" {
				return nil
			}
			res, err := hostfiles.InstallSnippet(snippet, confDir, hostConfDir, containerdCfg)
			if err != nil {
				return fmt.Errorf("--conf-dir %s: %w", confDir, err)
			}
			switch {
			case res.Foreign:
				fmt.Fprintf(out, "WARNING %s/%s exists and was not written by nvdomain: left alone; make sure it enables NRI and its default validator as manifests/containerd/nri.toml does\n", hostConfDir, hostfiles.SnippetName)
			case res.Changed:
				fmt.Fprintf(out, "wrote %s/%s: restart containerd to load it (containerd reads its config only at start)\n", hostConfDir, hostfiles.SnippetName)
			default:
				fmt.Fprintf(out, "%s/%s is up to date\n", hostConfDir, hostfiles.SnippetName)
			}
			switch {
			case !res.ConfigChecked && containerdCfg != "":
				fmt.Fprintf(out, "WARNING could not read containerd's config to check that it imports %s; it must contain: %s\n", hostConfDir, res.ImportHint)
			case containerdCfg != "" && !res.Imported:
				fmt.Fprintf(out, "WARNING containerd's config does not import %s, so the snippet has no effect; add this top-level line to it and restart containerd: %s\n", hostConfDir, res.ImportHint)
			}
			return nil
		},
	}
	f := install.Flags()
	f.StringVar(&hookSrc, "hook-src", "/nvdomain-nri-hook", "the hook binary in the image")
	f.StringVar(&hookDir, "hook-dir", "", "host directory (mounted) to copy the hook into; empty: skip")
	f.StringVar(&snippet, "nri-snippet", "/etc/nvdomain/containerd-nri.toml", "containerd's NRI snippet in the image")
	f.StringVar(&confDir, "conf-dir", "", "containerd's drop-in directory as mounted here; empty: skip the snippet")
	f.StringVar(&hostConfDir, "host-conf-dir", "/etc/containerd/conf.d", "the drop-in directory as containerd names it on the host")
	f.StringVar(&containerdCfg, "containerd-config", "", "containerd's main config as mounted here, to check its imports line; empty: not checked")
	cmd.AddCommand(install)
	return cmd
}

package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/nvdomain/nvdomain/pkg/containerdrestart"
	"github.com/nvdomain/nvdomain/pkg/hostfiles"
	"github.com/nvdomain/nvdomain/pkg/names"
)

// newNode is the chart's init-container step on each node: the release image has no shell,
// so copying the hook and the NRI snippet onto the host is a verb of this binary.
func newNode() *cobra.Command {
	cmd := &cobra.Command{Use: "node", Short: "Install nvdomain's files on a node's host filesystem (the chart's init containers run it)", Hidden: true}
	var (
		hookSrc, hookDir                             string
		snippet, confDir, hostConfDir, containerdCfg string
		hostContainerdCfg, containerdTmpl            string
		restart                                      bool
		ctrdSocket, toolkitNode, toolkitDir          string
		toolkitTimeout                               time.Duration
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
			printImportWarning(out, res, hostConfDir, hostContainerdCfg, containerdTmpl)
			if !restart {
				return nil
			}
			if !res.Imported || res.Foreign {
				fmt.Fprintf(out, "containerd is not restarted: it would not load the snippet (see above)\n")
				return nil
			}
			// On RKE2/k3s the config is regenerated at every start, just before containerd:
			// its time says nothing; the template beside it is what an administrator changes.
			cfgFile := containerdCfg
			if containerdTmpl != "" {
				cfgFile = filepath.Join(filepath.Dir(containerdCfg), filepath.Base(containerdTmpl))
			}
			opts := containerdrestart.Options{Socket: ctrdSocket, Files: []string{res.Path, cfgFile}, WaitTimeout: toolkitTimeout,
				Log: funcr.New(func(prefix, args string) { fmt.Fprintln(out, prefix, args) }, funcr.Options{})}
			if toolkitNode != "" && toolkitManaged(cmd.Context(), out, toolkitNode) {
				opts.WaitFile = filepath.Join(toolkitDir, names.ToolkitReadyFile)
			}
			r, err := containerdrestart.Ensure(cmd.Context(), opts)
			if err != nil {
				// Not a failure of the pod: the agent and the NRI plugin must still start (the
				// node's other GPU pods need the plugin), and the fail-closed canary reports a
				// node that still fails open.
				fmt.Fprintf(out, "WARNING containerd was not restarted, so it may not enforce the NRI plugin until it restarts: %v\n", err)
				return nil
			}
			switch {
			case r.Restarted:
				fmt.Fprintf(out, "restarted containerd (pid %d, started %s, before %s changed); pid %d serves it now\n", r.PID, r.Started.UTC().Format(time.RFC3339), r.NewestFile, r.NewPID)
			default:
				fmt.Fprintf(out, "containerd (pid %d) started %s, after the snippet and its config changed: no restart needed\n", r.PID, r.Started.UTC().Format(time.RFC3339))
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
	// The chart passes these two as variables: an older image ignores them, where an unknown
	// flag would stop its init container.
	f.StringVar(&hostContainerdCfg, "host-containerd-config", envOr("NVDOMAIN_HOST_CONTAINERD_CONFIG", "/etc/containerd/config.toml"), "containerd's main config as the host names it, for the messages ($NVDOMAIN_HOST_CONTAINERD_CONFIG)")
	f.StringVar(&containerdTmpl, "containerd-template", os.Getenv("NVDOMAIN_CONTAINERD_TEMPLATE"), "RKE2/k3s: the template containerd's config is generated from, where the imports line belongs ($NVDOMAIN_CONTAINERD_TEMPLATE)")
	f.BoolVar(&restart, "restart-containerd", false, "restart containerd (SIGTERM to the process serving --containerd-socket; its supervisor starts it again) when it started before the snippet or its config changed; needs the host's PID namespace")
	f.StringVar(&ctrdSocket, "containerd-socket", "/run/containerd/containerd.sock", "containerd's gRPC socket as mounted here")
	f.StringVar(&toolkitNode, "toolkit-node", "", "this node's name: when the GPU Operator runs its container toolkit here (label "+names.ToolkitDeployLabel+"=true), wait for the toolkit's own restart first; empty: never wait")
	f.StringVar(&toolkitDir, "toolkit-ready-dir", names.ToolkitReadyDir, "the GPU Operator validator's directory as mounted here")
	f.DurationVar(&toolkitTimeout, "toolkit-timeout", 10*time.Minute, "how long to wait for the toolkit before restarting containerd anyway")
	cmd.AddCommand(install)
	return cmd
}

// toolkitManaged reports whether the GPU Operator runs its container toolkit on node, from
// the Node's label, read with the pod's own credentials. A failed read is reported and taken
// as no: a node must not wait ten minutes for a toolkit it may not have.
func toolkitManaged(ctx context.Context, out io.Writer, node string) bool {
	// Bounded: an apiserver that never answers must not hold the node pod's start.
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cfg, err := rest.InClusterConfig()
	if err == nil {
		cfg.Timeout = 30 * time.Second
		var cs kubernetes.Interface
		if cs, err = kubernetes.NewForConfig(cfg); err == nil {
			var n *corev1.Node
			if n, err = cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); err == nil {
				return n.Labels[names.ToolkitDeployLabel] == "true"
			}
		}
	}
	fmt.Fprintf(out, "WARNING could not read node %s to see whether the GPU Operator's toolkit restarts containerd here (not waiting for it): %v\n", node, err)
	return false
}

// printImportWarning says, when containerd will not read the snippet, what to change and which
// chart value names it: the init container's log is where a node's administrator looks when
// the node's fail-closed condition says it fails open.
func printImportWarning(out io.Writer, res hostfiles.SnippetResult, hostConfDir, hostConfig, tmpl string) {
	if res.ImportHint == "" {
		return // the config was not to be checked
	}
	if hostConfig == "" {
		hostConfig = "containerd's config"
	}
	switch {
	case res.ConfigMissing:
		fmt.Fprintf(out, "WARNING %s does not exist on this node, so containerd reads another config or none, and the NRI snippet in %s has no effect: set the chart value node.containerdConfig to the config containerd reads (its --config flag; `containerd config dump` prints it), or node.containerdDistribution=rke2 or k3s on those distributions\n", hostConfig, hostConfDir)
	case !res.ConfigChecked:
		fmt.Fprintf(out, "WARNING could not read %s to check that it imports %s; it must contain: %s\n", hostConfig, hostConfDir, res.ImportHint)
	case res.Imported:
	case tmpl != "":
		fmt.Fprintf(out, "WARNING %s does not import %s, so the NRI snippet has no effect; it is generated from %s at every start: put this line at the top of that template, before {{ template \"base\" . }}, and restart the rke2-agent/rke2-server or k3s service: %s\n", hostConfig, hostConfDir, tmpl, res.ImportHint)
	default:
		fmt.Fprintf(out, "WARNING %s does not import %s, so the NRI snippet has no effect; add this top-level line to it (or the glob to its existing imports array) and restart containerd: %s\n", hostConfig, hostConfDir, res.ImportHint)
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

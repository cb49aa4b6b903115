// Package cli is the `nvdomain` command, also installed as the kubectl plugin
// `kubectl nvdomain`: the operator's tool to see what domains nvdomain finds on a machine or
// in a saved `nvidia-smi topo -m` / simulated-topology file, to check GPU Operator workload
// labels against advertised resources in a node dump, and, against a live cluster, to show
// every node's domains in use (status) and to say what nvdomain did with a pod or would do
// with a manifest (explain). The cluster verbs follow kubectl's shape, an Options struct
// with Complete, Validate and Run writing to IOStreams, and decide through the webhook's own
// code (pkg/admission, pkg/clusterview, pkg/repin), so they say what nvdomain does.
// cmd/nvdomain calls Main, cmd/kubectl-nvdomain KubectlPluginMain.
package cli

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/nvdomain/nvdomain/pkg/version"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/spf13/cobra"

	"github.com/nvdomain/nvdomain/pkg/certs"
	"github.com/nvdomain/nvdomain/pkg/checkconfig"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/topology"
	"github.com/nvdomain/nvdomain/pkg/topology/nvmltopo"
	"github.com/nvdomain/nvdomain/pkg/topology/topomatrix"
)

// Exit codes. check-config documents 1 for "mismatches found" and 2 for "could not check".
const (
	ExitOK       = 0
	ExitFindings = 1
	ExitError    = 2
)

// exitError carries a specific exit code through cobra.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// Command names: the binary, and the kubectl plugin (krew's convention: kubectl-<name> on
// PATH becomes `kubectl <name>`).
const (
	CommandName       = "nvdomain"
	PluginBinaryName  = "kubectl-nvdomain"
	pluginDisplayName = "kubectl nvdomain"
)

// Main runs the nvdomain command line and returns the process exit code.
func Main(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return run(ctx, CommandName, args, IOStreams{In: stdin, Out: stdout, ErrOut: stderr}, &KubeFlags{userAgent: CommandName + "/" + version.Version})
}

// KubectlPluginMain runs the same command tree as the kubectl plugin kubectl-nvdomain: help and
// errors name it `kubectl nvdomain`, and it connects as kubectl does (--kubeconfig, --context,
// -n), so `kubectl nvdomain status` works once the binary is on PATH.
func KubectlPluginMain(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return run(ctx, PluginBinaryName, args, IOStreams{In: stdin, Out: stdout, ErrOut: stderr}, &KubeFlags{userAgent: PluginBinaryName + "/" + version.Version})
}

func run(ctx context.Context, name string, args []string, streams IOStreams, f ClusterFactory) int {
	root := newRoot(name, streams, f)
	root.SetArgs(args)
	root.SetIn(streams.In)
	root.SetOut(streams.Out)
	root.SetErr(streams.ErrOut)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	prefix := root.DisplayName()
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil && ee.code == ExitError {
			fmt.Fprintf(streams.ErrOut, "%s: %v\n", prefix, ee.err)
		}
		return ee.code
	}
	fmt.Fprintf(streams.ErrOut, "%s: %v\n", prefix, err)
	return ExitError
}

func newRoot(name string, streams IOStreams, f ClusterFactory) *cobra.Command {
	root := &cobra.Command{
		Use:           name,
		Short:         "Inspect NVLink/NVSwitch domains, their use in a cluster, and GPU workload configuration",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	if name == PluginBinaryName {
		root.Annotations = map[string]string{cobra.CommandDisplayNameAnnotation: pluginDisplayName}
	}
	root.AddCommand(newTopology(streams.In), newCheckConfig(streams.In), newPools(streams.In), newCerts(), newNode(), newUninstall(f, streams), newStatus(f, streams), newExplain(f, streams), &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), version.Version)
			return err
		},
	})
	return root
}

type outputFlag struct{ format string }

func (o *outputFlag) register(cmd *cobra.Command) {
	cmd.Flags().StringVarP(&o.format, "output", "o", "json", "output format: json or table")
}

func (o *outputFlag) validate() error {
	if o.format != "json" && o.format != "table" {
		return fmt.Errorf("--output %q: use json or table", o.format)
	}
	return nil
}

func newTopology(stdin io.Reader) *cobra.Command {
	cmd := &cobra.Command{Use: "topology", Short: "Find the NVLink domains of a node"}

	var out outputFlag
	var format, node string
	var strict bool
	parse := &cobra.Command{
		Use:   "parse --format topo-matrix|simulated FILE",
		Short: "Read `nvidia-smi topo -m` output or a simulated-topology document (FILE - reads stdin)",
		Long: `Reads FILE (or stdin with -) and prints the node's GPUs and NVLink domains.

--format topo-matrix takes ` + "`nvidia-smi topo -m`" + ` output as people paste it: with or without the
legend, tabs or runs of spaces, blank lines between rows, rows wrapped by a narrow terminal or
a mail client, shell prompts and prose around it, Markdown code fences, quotes and tables
(| GPU0 | X | NV18 |). A cell it cannot read counts as missing: a GPU pair is linked only when
one of its two cells reads NV#, so every domain is a set of GPUs whose links were all seen.
What could not be read is printed as warnings; --strict turns them into an error.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := out.validate(); err != nil {
				return err
			}
			data, err := readInput(args[0], stdin)
			if err != nil {
				return err
			}
			switch format {
			case names.SourceTopoMatrix:
				if node != "" {
					return fmt.Errorf("--node applies to --format simulated only")
				}
				top, err := topomatrix.ParseBytes(data, topomatrix.Options{Strict: strict})
				if err != nil {
					return fmt.Errorf("%s: %w", args[0], err)
				}
				return writeTopologies(cmd.OutOrStdout(), out.format, []namedTopology{{Topology: top}})
			case names.SourceSimulated:
				doc, err := parseSimulated(args[0], data)
				if err != nil {
					return err
				}
				var tops []namedTopology
				for _, n := range doc.Nodes {
					if node == "" || n.Name == node {
						tops = append(tops, namedTopology{Node: n.Name, Topology: n.Topology})
					}
				}
				// A pool's shape prints under "pool/<name>" (--node pool/<name> picks one).
				for _, p := range doc.Pools {
					if name := "pool/" + p.Name; node == "" || name == node {
						tops = append(tops, namedTopology{Node: name, Topology: p.Topology})
					}
				}
				if len(tops) == 0 {
					_, err := doc.ForNode(node)
					return err
				}
				return writeTopologies(cmd.OutOrStdout(), out.format, tops)
			}
			return fmt.Errorf("--format %q: use topo-matrix or simulated", format)
		},
	}
	parse.Flags().StringVar(&format, "format", names.SourceTopoMatrix, "input format: topo-matrix or simulated")
	parse.Flags().StringVar(&node, "node", "", "with --format simulated: print only this node")
	parse.Flags().BoolVar(&strict, "strict", false, "with --format topo-matrix: fail on cut-off or inconsistent output instead of warning")
	out.register(parse)

	var dout outputFlag
	discover := &cobra.Command{
		Use:   "discover",
		Short: "Discover this machine's GPUs and NVLink domains through NVML",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := dout.validate(); err != nil {
				return err
			}
			top, err := nvmltopo.Discover(cmd.Context(), nvml.New(), nvmltopo.Options{})
			if err != nil {
				return err
			}
			return writeTopologies(cmd.OutOrStdout(), dout.format, []namedTopology{{Topology: top}})
		},
	}
	dout.register(discover)
	cmd.AddCommand(parse, discover)
	return cmd
}

func readInput(path string, stdin io.Reader) ([]byte, error) {
	if path == "-" {
		data, err := io.ReadAll(stdin)
		if err != nil {
			return nil, fmt.Errorf("read stdin: %w", err)
		}
		return data, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return data, nil
}

type namedTopology struct {
	Node     string
	Topology *topology.Topology
}

// writeTopologies prints one topology as its JSON document, or several (a simulated document
// with many nodes) as a JSON array whose items add a "node" field.
func writeTopologies(w io.Writer, format string, tops []namedTopology) error {
	if format == "table" {
		return writeTable(w, tops)
	}
	var doc any = tops[0].Topology
	if len(tops) > 1 || tops[0].Node != "" {
		items := make([]map[string]any, 0, len(tops))
		for _, t := range tops {
			b, err := json.Marshal(t.Topology)
			if err != nil {
				return err
			}
			var m map[string]any
			if err := json.Unmarshal(b, &m); err != nil {
				return err
			}
			m["node"] = t.Node
			items = append(items, m)
		}
		doc = items
		if len(items) == 1 {
			doc = items[0]
		}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(doc)
}

func writeTable(w io.Writer, tops []namedTopology) error {
	for i, t := range tops {
		top := t.Topology
		if i > 0 {
			fmt.Fprintln(w)
		}
		if t.Node != "" {
			fmt.Fprintf(w, "node: %s\n", t.Node)
		}
		fmt.Fprintf(w, "source: %s  gpus: %d  domains: %d  largest domain: %d\n", top.Source, len(top.GPUs), len(top.Domains), top.MaxDomainSize())
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "DOMAIN\tSIZE\tGPUS\tNUMA\tPRODUCT")
		for _, d := range top.Domains {
			var numa []int
			var products []string
			for _, idx := range d.GPUs {
				g, _ := top.GPU(idx)
				if g.NUMANode != nil && !slices.Contains(numa, *g.NUMANode) {
					numa = append(numa, *g.NUMANode)
				}
				if g.Product != "" && !slices.Contains(products, g.Product) {
					products = append(products, g.Product)
				}
			}
			fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\n", d.ID, d.Size(), names.FormatGPUList(d.GPUs), orDash(names.FormatGPUList(slices.Sorted(slices.Values(numa)))), orDash(strings.Join(products, ", ")))
		}
		if len(top.Domains) == 0 {
			fmt.Fprintln(tw, "-\t0\t-\t-\t-")
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintf(w, "unlinked: %s\n", orNone(names.FormatGPUList(top.Unlinked)))
		var mig []int
		for _, g := range top.GPUs {
			if g.MIG {
				mig = append(mig, g.Index)
			}
		}
		if len(mig) > 0 {
			fmt.Fprintf(w, "MIG mode (in no domain, never packed): %s\n", names.FormatGPUList(mig))
		}
		for _, g := range top.GPUs {
			if g.Unhealthy != "" {
				fmt.Fprintf(w, "unhealthy: GPU %d: %s\n", g.Index, g.Unhealthy)
			}
		}
		for _, msg := range top.Warnings {
			fmt.Fprintf(w, "warning: %s\n", msg)
		}
	}
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func newCerts() *cobra.Command {
	cmd := &cobra.Command{Use: "certs", Short: "Webhook certificates for clusters without cert-manager"}
	var o certs.Options
	var dir string
	gen := &cobra.Command{
		Use:   "generate --out-dir DIR",
		Short: "Write a self-signed CA and a webhook serving certificate to DIR and print the caBundle",
		Long: `Writes ca.crt, tls.crt and tls.key to --out-dir (the layout of a kubernetes.io/tls Secret)
and prints the base64 caBundle for the webhook configurations on stdout:

  nvdomain certs generate --out-dir ./tls --service nvdomain-webhook --namespace nvdomain-system
  kubectl -n nvdomain-system create secret tls nvdomain-webhook-tls --cert tls/tls.crt --key tls/tls.key`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dir == "" {
				return fmt.Errorf("--out-dir is required")
			}
			b, err := certs.Generate(o)
			if err != nil {
				return err
			}
			if err := b.WriteDir(dir); err != nil {
				return err
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), base64.StdEncoding.EncodeToString(b.CACert))
			return err
		},
	}
	gen.Flags().StringVar(&dir, "out-dir", "", "directory to write ca.crt, tls.crt and tls.key to")
	gen.Flags().StringVar(&o.Service, "service", "nvdomain-webhook", "webhook Service name")
	gen.Flags().StringVar(&o.Namespace, "namespace", "nvdomain-system", "webhook Service namespace")
	gen.Flags().StringSliceVar(&o.Hosts, "host", nil, "extra DNS name or IP the webhook is reached at (repeatable), e.g. 127.0.0.1")
	gen.Flags().DurationVar(&o.Validity, "validity", 365*24*time.Hour, "serving certificate lifetime")
	cmd.AddCommand(gen)
	return cmd
}

func newCheckConfig(stdin io.Reader) *cobra.Command {
	var migConfig, now, noTimestamp string
	var pendingTimeout time.Duration
	cmd := &cobra.Command{
		Use:   "check-config NODES.json",
		Short: "Check GPU workload, MIG and time-slicing labels against advertised GPU resources",
		Long: `Reads a 'kubectl get nodes -o json' dump (NODES.json, or - for stdin) and checks each node
that carries one of these labels (such a node counts in OK=<n>; a node with none is skipped):

  nvidia.com/gpu.workload.config  container nodes must advertise nvidia.com/gpu (or MIG /
                                  time-sliced names), vm-vgpu nodes a vGPU profile,
                                  vm-passthrough nodes a device model name, no node two kinds.
  nvidia.com/mig.config.state     failed is a mismatch; so is pending or rebooting for longer
                                  than --mig-pending-timeout.
  nvidia.com/mig.config           with --mig-config, the node must advertise exactly what that
                                  layout makes of its nvidia.com/gpu.count GPUs under its
                                  nvidia.com/mig.strategy (mixed: nvidia.com/mig-<profile> per
                                  profile, nvidia.com/gpu for GPUs without MIG; single: every MIG
                                  device as nvidia.com/gpu). Without --mig-config only the state
                                  is checked.
  nvidia.com/gpu.replicas         above 1, time-slicing: nvidia.com/gpu.shared (renamed, product
                                  ending in -SHARED) or nvidia.com/gpu must be GPUs x replicas.

How long a MIG state has been pending is read from the node's managedFields: the API server
stamps the entry of the field manager that owns nvidia.com/mig.config.state with the time of its
last write. kubectl leaves managedFields out unless asked, so dump with
  kubectl get nodes -o json --show-managed-fields > nodes.json
A dump without them cannot say; pending then counts as fine, unless
--mig-pending-no-timestamp=mismatch. --now sets the time the dump is judged at (the time it was
taken, for an old dump).

Prints MISMATCH=<node> <reason> per bad node and exits 1, or OK=<nodes checked> and exits 0;
a dump in which no node carries one of these labels prints NONE=<nodes in the dump> and exits 1.
Exits 2 when the dump or a flag's file cannot be read.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts := checkconfig.Options{
				PendingTimeout:     pendingTimeout,
				PendingWithoutTime: checkconfig.PendingPolicy(noTimestamp),
			}
			if noTimestamp != string(checkconfig.PendingOK) && noTimestamp != string(checkconfig.PendingMismatch) {
				return &exitError{ExitError, fmt.Errorf("--mig-pending-no-timestamp %q: use %s or %s", noTimestamp, checkconfig.PendingOK, checkconfig.PendingMismatch)}
			}
			if pendingTimeout < 0 {
				return &exitError{ExitError, fmt.Errorf("--mig-pending-timeout %s: use a positive duration such as 30m, or 0 to turn the age check off", pendingTimeout)}
			}
			if now != "" {
				t, err := time.Parse(time.RFC3339, now)
				if err != nil {
					return &exitError{ExitError, fmt.Errorf("--now %q: use an RFC 3339 time such as 2026-03-01T10:00:00Z", now)}
				}
				opts.Now = t
			}
			if migConfig != "" {
				data, err := os.ReadFile(migConfig)
				if err != nil {
					return &exitError{ExitError, fmt.Errorf("--mig-config: %w", err)}
				}
				cfg, err := checkconfig.ParseMIGConfig(data)
				if err != nil {
					return &exitError{ExitError, fmt.Errorf("--mig-config %s: %w", migConfig, err)}
				}
				opts.MIGConfig, opts.MIGConfigSource = cfg, migConfig
			}
			data, err := readInput(args[0], stdin)
			if err != nil {
				return &exitError{ExitError, err}
			}
			rep, err := checkconfig.Check(strings.NewReader(string(data)), names.Default(), opts)
			if err != nil {
				return &exitError{ExitError, fmt.Errorf("%s: %w", args[0], err)}
			}
			if err := rep.Write(cmd.OutOrStdout()); err != nil {
				return &exitError{ExitError, err}
			}
			if len(rep.Mismatches) > 0 || rep.NothingChecked() {
				return &exitError{code: ExitFindings}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&migConfig, "mig-config", "", "mig-parted config that nvidia.com/mig.config labels name: the file itself, or its ConfigMap as 'kubectl get cm "+names.DefaultMIGPartedConfigMap+" -o yaml' prints it (data."+names.MIGPartedConfigKey+")")
	f.DurationVar(&pendingTimeout, "mig-pending-timeout", 30*time.Minute, "how long nvidia.com/mig.config.state may stay pending or rebooting before it is a mismatch; 0 turns the check off")
	f.StringVar(&noTimestamp, "mig-pending-no-timestamp", string(checkconfig.PendingOK), "what a pending state counts as when the dump has no managedFields to date it: ok or mismatch")
	f.StringVar(&now, "now", "", "time the dump is judged at, RFC 3339 (default: the current time)")
	return cmd
}

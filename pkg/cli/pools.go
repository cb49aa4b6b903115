package cli

import (
	"context"
	"fmt"
	"io"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/spf13/cobra"

	"github.com/nvdomain/nvdomain/pkg/autoscaler"
	"github.com/nvdomain/nvdomain/pkg/clusterview"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/topology/simulated"
)

func newPools(stdin io.Reader) *cobra.Command {
	var target string
	var o autoscaler.Options
	var namesFromFlags func() (names.Names, error)
	cmd := &cobra.Command{
		Use:   "pools FILE --for karpenter|aws",
		Short: "Print what an autoscaler must know of the declared GPU pools (FILE - reads stdin)",
		Long: `Reads a document with the GPU pools that scale from zero (the chart's pools value, the
pools ConfigMap's topology.json; docs/pools.md) and prints what the autoscaler must be told
so that it adds a node for a tensor-parallel pod that waits for a pool:

  --for karpenter  a NodeOverlay per pool with the domain resources its nodes offer (Karpenter
                   runs with --feature-gates NodeOverlay=true), and, as a comment, the labels
                   the NodePool's template must put on its nodes;
  --for aws        the Cluster Autoscaler's node-template tags for the pool's Auto Scaling group.

--gpu-capacity adds nvidia.com/gpu to the capacity, for instance types the provider does
not know the GPUs of (a cloud provider counts them for its GPU instance types).

  nvdomain pools pools.json --for karpenter | kubectl apply -f -`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			data, err := readInput(args[0], stdin)
			if err != nil {
				return err
			}
			doc, err := parseSimulated(args[0], data)
			if err != nil {
				return err
			}
			if len(doc.Pools) == 0 {
				return fmt.Errorf("%s declares no pools: add them under \"pools\" (docs/pools.md)", args[0])
			}
			n, err := namesFromFlags()
			if err != nil {
				return fmt.Errorf("--label-prefix/--resource-prefix: %w", err)
			}
			switch target {
			case "karpenter":
				out, err := autoscaler.Karpenter(doc, n, o)
				if err != nil {
					return err
				}
				_, err = cmd.OutOrStdout().Write(out)
				return err
			case "aws":
				_, err := cmd.OutOrStdout().Write(autoscaler.AWS(doc, n, o))
				return err
			}
			return fmt.Errorf("--for %q: use karpenter or aws", target)
		},
	}
	cmd.Flags().StringVar(&target, "for", "karpenter", "the autoscaler: karpenter or aws (Cluster Autoscaler on AWS)")
	cmd.Flags().BoolVar(&o.GPUs, "gpu-capacity", false, "add nvidia.com/gpu to the capacity, for instance types whose GPUs the provider does not know")
	// The labels and resources must be spelled as the cluster's webhook and agents spell them.
	namesFromFlags = addNamesFlags(cmd)
	return cmd
}

// DefaultPoolsConfigMap is where the chart's default release keeps the declared pools.
const DefaultPoolsConfigMap = "nvdomain-system/nvdomain-pools"

// loadPools reads the declared pools from the ConfigMap ref (namespace/name) as the webhook
// does. A missing ConfigMap declares none; one the user may not read, or that does not parse,
// declares none too, with a warning saying so (status and explain then cannot tell a pod that
// waits for a pool from one that waits for nothing).
func loadPools(ctx context.Context, c kubernetes.Interface, n names.Names, ref string) ([]clusterview.Pool, string, error) {
	if ref == "" {
		return nil, "", nil
	}
	ns, name, ok := strings.Cut(ref, "/")
	if !ok || ns == "" || name == "" {
		return nil, "", fmt.Errorf("--pools-configmap %q: give namespace/name, e.g. %s", ref, DefaultPoolsConfigMap)
	}
	cm, err := c.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, "", nil
	case apierrors.IsForbidden(err):
		return nil, fmt.Sprintf("cannot read the declared GPU pools (ConfigMap %s): pods waiting for a pool to scale up look like pods waiting for nothing; grant get on that ConfigMap, or pass --pools-configmap", ref), nil
	case err != nil:
		return nil, "", fmt.Errorf("get the pools ConfigMap %s: %w", ref, err)
	}
	p, err := simulated.NewParser()
	if err != nil {
		return nil, "", err
	}
	pools, err := clusterview.PoolsFromConfigMap(p, cm, n)
	if err != nil {
		return nil, fmt.Sprintf("the declared GPU pools (ConfigMap %s, key %s) do not parse, and the webhook keeps the last version that did: %v", ref, simulated.ConfigMapKey, err), nil
	}
	return pools, "", nil
}

// parseSimulated parses a simulated-topology document read from name.
func parseSimulated(name string, data []byte) (*simulated.Document, error) {
	p, err := simulated.NewParser()
	if err != nil {
		return nil, err
	}
	doc, err := p.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return doc, nil
}

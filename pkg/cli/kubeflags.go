package cli

import (
	"fmt"
	"io"

	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// IOStreams are where a command reads and writes: kubectl's genericiooptions.IOStreams in
// small, so tests drive the commands with buffers.
type IOStreams struct {
	In     io.Reader
	Out    io.Writer
	ErrOut io.Writer
}

// ClusterFactory gives the commands that read a cluster (status, explain) their client and
// namespace. KubeFlags is the real one; unit tests hand in fake clientsets.
type ClusterFactory interface {
	// AddFlags registers the connection flags on a command.
	AddFlags(fs *pflag.FlagSet)
	Client() (kubernetes.Interface, error)
	// Namespace is the namespace to work in and whether the user named it with -n, resolved
	// as kubectl resolves it: the flag, else the kubeconfig context's, else "default".
	Namespace() (ns string, explicit bool, err error)
}

// KubeFlags are kubectl's connection flags, --kubeconfig, --context and -n/--namespace, read
// through client-go's loading rules ($KUBECONFIG and ~/.kube/config when --kubeconfig is not
// given), so `kubectl nvdomain` connects wherever `kubectl` does. k8s.io/cli-runtime's
// ConfigFlags would do the same, but no release of it matching the module's k8s.io v0.36.2
// is in the module cache, and its kustomize dependencies would come along for three flags.
type KubeFlags struct {
	kubeconfig string
	context    string
	namespace  string
	// userAgent names the binary in the apiserver's audit log.
	userAgent string
}

// AddFlags implements ClusterFactory.
func (k *KubeFlags) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&k.kubeconfig, "kubeconfig", "", "path to the kubeconfig file (default $KUBECONFIG, else ~/.kube/config)")
	fs.StringVar(&k.context, "context", "", "the kubeconfig context to use")
	fs.StringVarP(&k.namespace, "namespace", "n", "", "the namespace (default: the kubeconfig context's)")
}

func (k *KubeFlags) clientConfig() clientcmd.ClientConfig {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = k.kubeconfig
	overrides := &clientcmd.ConfigOverrides{CurrentContext: k.context}
	overrides.Context.Namespace = k.namespace
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides)
}

// Client implements ClusterFactory.
func (k *KubeFlags) Client() (kubernetes.Interface, error) {
	cfg, err := k.clientConfig().ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("load the kubeconfig (--kubeconfig, $KUBECONFIG or ~/.kube/config; --context picks a context): %w", err)
	}
	if k.userAgent != "" {
		cfg.UserAgent = k.userAgent
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("build a client for %s: %w", cfg.Host, err)
	}
	return c, nil
}

// Namespace implements ClusterFactory.
func (k *KubeFlags) Namespace() (string, bool, error) {
	ns, explicit, err := k.clientConfig().Namespace()
	if err != nil {
		return "", false, fmt.Errorf("find the namespace in the kubeconfig (or pass -n): %w", err)
	}
	return ns, explicit, nil
}

// Command foreignplugin is a test NRI plugin that does what the NVIDIA container toolkit's own
// NRI plugin (GPU Operator cdi.nriPluginEnabled) does: it injects the CDI devices a pod's
// nvidia.cdi.k8s.io/container.<name> annotation names into that container. The containerd
// tier runs it beside nvdomain's plugin to prove that such a grant, which NRI never shows
// another plugin, is refused by nvdomain's validator.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"

	"github.com/nvdomain/nvdomain/pkg/names"
)

type plugin struct{}

// CreateContainer adds the devices the pod's annotation names for this container.
func (plugin) CreateContainer(_ context.Context, pod *api.PodSandbox, ctr *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	v, ok := pod.GetAnnotations()[names.ToolkitCDIAnnotationPrefix+"container."+ctr.GetName()]
	if !ok {
		return nil, nil, nil
	}
	adj := &api.ContainerAdjustment{}
	for _, name := range strings.Split(v, ",") {
		adj.AddCDIDevice(&api.CDIDevice{Name: strings.TrimSpace(name)})
	}
	return adj, nil, nil
}

func main() {
	socket := flag.String("socket-path", "", "NRI socket")
	name := flag.String("plugin-name", "nvidia-cdi", "plugin name")
	idx := flag.String("plugin-idx", "20", "plugin index")
	flag.Parse()
	s, err := stub.New(plugin{}, stub.WithSocketPath(*socket), stub.WithPluginName(*name), stub.WithPluginIdx(*idx))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := s.Run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

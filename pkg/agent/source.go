package agent

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/nvdomain/nvdomain/pkg/topology"
	"github.com/nvdomain/nvdomain/pkg/topology/simulated"
	"github.com/nvdomain/nvdomain/pkg/topology/source"
)

// ConfigMapSource watches one ConfigMap through the API (the simulated topology, which stands
// in for NVSwitch hardware on nodes without it) and reads this node's entry from its
// topology.json key. Every change of the ConfigMap signals Changes.
type ConfigMapSource struct {
	Namespace, Name, Node string
	Parser                *simulated.Parser
	// NodeLabels reads the node's labels, for a node the document declares through a pool's
	// nodeSelector rather than by name (one an autoscaler added); nil: by name only.
	NodeLabels source.NodeLabels

	mu      sync.Mutex
	data    *string
	present bool
	changes chan struct{}
	// parsedFrom is the data the cached parse (parsed, parseErr) was made from: Document
	// parses each version of the ConfigMap once, however many nodes read it.
	parsedFrom *string
	parsed     *simulated.Document
	parseErr   error
}

// NewConfigMapSource starts an informer on the one ConfigMap and waits for its first sync.
func NewConfigMapSource(ctx context.Context, client kubernetes.Interface, namespace, name, node string, p *simulated.Parser) (*ConfigMapSource, error) {
	s := &ConfigMapSource{Namespace: namespace, Name: name, Node: node, Parser: p, changes: make(chan struct{}, 1)}
	if node != "" {
		s.NodeLabels = source.KubeNodeLabels(client, node)
	}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
		}))
	inf := factory.Core().V1().ConfigMaps().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.set(obj) },
		UpdateFunc: func(_, obj any) { s.set(obj) },
		DeleteFunc: func(any) { s.unset() },
	}); err != nil {
		return nil, err
	}
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil, fmt.Errorf("watch ConfigMap %s/%s: informer did not sync", namespace, name)
	}
	return s, nil
}

func (s *ConfigMapSource) set(obj any) {
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		return
	}
	s.mu.Lock()
	v, has := cm.Data[simulated.ConfigMapKey]
	s.present = true
	s.data = nil
	if has {
		s.data = &v
	}
	s.mu.Unlock()
	s.signal()
}

func (s *ConfigMapSource) unset() {
	s.mu.Lock()
	s.present, s.data = false, nil
	s.mu.Unlock()
	s.signal()
}

func (s *ConfigMapSource) signal() {
	select {
	case s.changes <- struct{}{}:
	default:
	}
}

func (s *ConfigMapSource) Describe() string {
	return fmt.Sprintf("ConfigMap %s/%s", s.Namespace, s.Name)
}

func (s *ConfigMapSource) Load(ctx context.Context) (*topology.Topology, error) {
	doc, err := s.Document(ctx)
	if err != nil {
		return nil, err
	}
	top, err := source.Resolve(ctx, doc, s.Node, s.NodeLabels)
	if err != nil {
		return nil, fmt.Errorf("ConfigMap %s/%s key %s: %w", s.Namespace, s.Name, simulated.ConfigMapKey, err)
	}
	return top, nil
}

// Document parses the whole document (a DocumentSource for a Fleet).
func (s *ConfigMapSource) Document(context.Context) (*simulated.Document, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case !s.present:
		return nil, fmt.Errorf("ConfigMap %s/%s does not exist; create it with the simulated topology under the key %s", s.Namespace, s.Name, simulated.ConfigMapKey)
	case s.data == nil:
		return nil, fmt.Errorf("ConfigMap %s/%s has no key %s; put the simulated-topology JSON there", s.Namespace, s.Name, simulated.ConfigMapKey)
	}
	if s.parsedFrom != s.data {
		s.parsedFrom = s.data
		s.parsed, s.parseErr = s.Parser.Parse([]byte(*s.data))
		if s.parseErr != nil {
			s.parseErr = fmt.Errorf("ConfigMap %s/%s key %s: %w", s.Namespace, s.Name, simulated.ConfigMapKey, s.parseErr)
		}
	}
	return s.parsed, s.parseErr
}

func (s *ConfigMapSource) Changes() <-chan struct{} { return s.changes }

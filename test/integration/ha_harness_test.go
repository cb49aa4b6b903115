package integration

import (
	"testing"

	"github.com/nvdomain/nvdomain/test/hacluster"
)

// haCluster is the webhook as production runs it (package test/hacluster: replicas behind
// the Service, resolved through its EndpointSlice), with this package's helpers around it.
type haCluster struct {
	*cluster
	*hacluster.Cluster
}

// startHACluster starts envtest's apiserver (with aggregator routing) and etcd, the real
// kube-scheduler, kube-controller-manager's ReplicaSet and garbage-collector controllers,
// and n webhook replicas behind the Service, with the shipped webhook configurations.
func startHACluster(t *testing.T, n int, webhookArgs ...string) *haCluster {
	t.Helper()
	// The rollout tests roll Deployments, so the deployment controller runs too.
	hc := hacluster.Start(t, hacluster.Options{Replicas: n, WebhookArgs: webhookArgs,
		Controllers: []string{"deployment", "replicaset", "garbagecollector"}})
	c := &cluster{t: t, env: hc.Env, cfg: hc.Config, client: hc.Client, warnings: &warningRecorder{}}
	return &haCluster{cluster: c, Cluster: hc}
}

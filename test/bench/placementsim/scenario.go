package placementsim

import (
	"fmt"
	"math/rand/v2"
)

// Scenario is a cluster and the work offered to it.
type Scenario struct {
	Name  string
	Nodes func() []*Node
	// Mix and MeanDuration shape the batch jobs: Poisson arrivals, exponential durations.
	Mix          []SizeShare
	MeanDuration float64
	// Services are the GPU counts of long-lived services, all arriving at time 0 with
	// priority 1 (production serving outranks batch). Each is rolled at Poisson times, on
	// average every MeanRoll.
	Services []int
	MeanRoll float64
}

// PoolMix is the batch mix of a pool whose largest domain is 4 GPUs: SizeMix without TP=8,
// its share given to TP=4.
var PoolMix = []SizeShare{{1, 0.40}, {2, 0.30}, {4, 0.30}}

// Scenarios are the clusters of docs/benchmarks.md: the mixed 64-node cluster, a pool of 8
// split nodes (two 4-GPU domains each) with TP 1/2/4 jobs, and the same pool where a quarter
// of the GPUs serve long-lived services that are rolled now and then beside the batch jobs.
func Scenarios() []Scenario {
	pool := func() []*Node { return Cluster(0, 8, 0) }
	return []Scenario{
		{Name: "mixed 64 nodes", Nodes: func() []*Node { return Cluster(32, 16, 16) }, Mix: SizeMix, MeanDuration: 10},
		{Name: "split pool", Nodes: pool, Mix: PoolMix, MeanDuration: 10},
		{Name: "split pool + rolled services", Nodes: pool, Mix: PoolMix, MeanDuration: 10,
			Services: []int{4, 4, 2, 2, 1, 1, 1, 1}, MeanRoll: 40},
	}
}

// GPUs is the scenario's GPU count.
func (s Scenario) GPUs() int { return 8 * len(s.Nodes()) }

// Trace draws the scenario's work with an offered load of load × its GPUs: the services'
// GPUs (held from time 0 to the horizon when nothing waits) plus batch jobs for the rest.
// Without services it is Trace's batch trace for the scenario's mix.
func (s Scenario) Trace(seed uint64, load, horizon float64) ([]Job, error) {
	gpus := s.GPUs()
	held := 0
	for _, k := range s.Services {
		held += k
	}
	batch := load - float64(held)/float64(gpus)
	if batch < 0 {
		return nil, fmt.Errorf("scenario %q: its services alone offer %.0f%% of the GPUs, more than the %.0f%% load asked for",
			s.Name, 100*float64(held)/float64(gpus), 100*load)
	}
	var jobs []Job
	rng := rand.New(rand.NewPCG(seed, 0x5e41ce5))
	for i, k := range s.Services {
		var rolls []float64
		for t := rng.ExpFloat64() * s.MeanRoll; s.MeanRoll > 0 && t < horizon; t += rng.ExpFloat64() * s.MeanRoll {
			rolls = append(rolls, t)
		}
		jobs = append(jobs, Job{ID: i, Size: k, Priority: 1, Service: true, Rolls: rolls})
	}
	for _, j := range batchTrace(seed, gpus, batch, s.MeanDuration, horizon, s.Mix) {
		j.ID += len(s.Services)
		jobs = append(jobs, j)
	}
	return jobs, nil
}

// Scaled is the scenario on f times its nodes (the same mix of machines, repeated) with f
// times its services: the same load on a larger cluster, where the scheduler samples nodes
// (DRAShipped) and a hint names 8 of many.
func (s Scenario) Scaled(f int) Scenario {
	base := s.Nodes
	s.Nodes = func() []*Node {
		var out []*Node
		for range f {
			for _, n := range base() {
				out = append(out, newNode(n.Kind, len(out)))
			}
		}
		return out
	}
	var svc []int
	for range f {
		svc = append(svc, s.Services...)
	}
	s.Services = svc
	s.Name = fmt.Sprintf("%s ×%d", s.Name, f)
	return s
}

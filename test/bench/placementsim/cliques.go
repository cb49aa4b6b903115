package placementsim

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/nvdomain/nvdomain/pkg/placement"
)

// Groups on GB200/GB300 NVL72 racks (issue 36). An NVL72 rack is 18 compute trays of 4 GPUs
// on one NVLink fabric, which the operator may partition into cliques (the nodes NVIDIA GFD
// labels with one nvidia.com/gpu.clique value). A group of pods (a LeaderWorkerSet group: a
// leader and workers, TP × PP over several trays) runs at NVLink speed only when every pod is
// in one clique. The model here replays a seeded trace of such groups mixed with single-node
// TP pods on 8 racks under four policies: the stock scheduler, blind to cliques; label-level
// gang placement, first fit (KAI / Kueue TAS); nvdomain as it ships, whose clique and node
// choices are the production code (placement.ChooseClique, placement.DomainChooser, and a
// mirror of clusterview.(*View).FragmentedClique); and nvdomain with Kubernetes' Workload API
// gang scheduling on (a PodGroup per group, topology on the clique label), modelled
// (NvdomainCliques says how).
//
// Each tray is one node and one 4-GPU NVSwitch domain as the node sees it, so inside a tray
// any GPUs a pod gets are linked, and only how many a tray has free matters: the model keeps
// counts, not GPU indexes.

const (
	// TrayGPUs is one NVL72 compute tray's GPUs: a node, and one NVSwitch domain on it.
	TrayGPUs = 4
	// RackTrays is the compute trays of one NVL72 rack.
	RackTrays = 18
)

// RackLayout is a cluster of NVL72 racks and how their fabric is partitioned into cliques.
type RackLayout struct {
	Name  string
	Racks int
	// SplitRacks is how many of the racks, the last ones, are partitioned into two cliques of
	// RackTrays/2 trays each (what an operator does to isolate tenants, or what a fabric
	// manager partition leaves); the others are one clique of RackTrays trays.
	SplitRacks int
}

// RackLayouts are the layouts of the report: 8 racks, each one clique of 18 trays (the fabric
// as shipped); the same racks each partitioned into two cliques of 9 trays, where a group of 8
// trays leaves one tray of its clique to everyone else; and half of each, where "the smaller
// clique" in the chooser's tightest fit has cliques of two sizes to tell apart.
func RackLayouts() []RackLayout {
	return []RackLayout{
		{Name: "8 racks, one clique of 18 trays each", Racks: 8},
		{Name: "8 racks, each two cliques of 9 trays", Racks: 8, SplitRacks: 8},
		{Name: "8 racks, 4 whole and 4 in two cliques", Racks: 8, SplitRacks: 4},
	}
}

// GPUs is the layout's GPU count.
func (l RackLayout) GPUs() int { return l.Racks * RackTrays * TrayGPUs }

// tray is one compute tray: a node of TrayGPUs GPUs in one clique.
type tray struct {
	name   string
	clique int
	free   int
}

// rackClique is one clique: its label value, its trays by index, and how many of them are
// empty (a group pod takes a whole tray, so that count is the room a group has).
type rackClique struct {
	id    string
	trays []int
	empty int
}

// rackCluster is the trays and cliques of a layout, cliques in label order (the order
// ChooseClique breaks ties in, and the fixed order first fit takes them in).
type rackCluster struct {
	trays   []tray
	cliques []rackClique
}

func (l RackLayout) build() *rackCluster {
	c := &rackCluster{}
	for r := range l.Racks {
		parts := 1
		if r >= l.Racks-l.SplitRacks {
			parts = 2
		}
		for p := range parts {
			id := fmt.Sprintf("r%d", r)
			if parts > 1 {
				id = fmt.Sprintf("r%d.%d", r, p)
			}
			cl := rackClique{id: id}
			for t := p * RackTrays / parts; t < (p+1)*RackTrays/parts; t++ {
				cl.trays = append(cl.trays, len(c.trays))
				c.trays = append(c.trays, tray{name: fmt.Sprintf("r%d-t%02d", r, t), clique: len(c.cliques), free: TrayGPUs})
			}
			cl.empty = len(cl.trays)
			c.cliques = append(c.cliques, cl)
		}
	}
	return c
}

// take gives one pod of k GPUs room on tray t.
func (c *rackCluster) take(t, k int) {
	tr := &c.trays[t]
	if tr.free == TrayGPUs {
		c.cliques[tr.clique].empty--
	}
	tr.free -= k
}

// give returns what take took.
func (c *rackCluster) give(t, k int) {
	tr := &c.trays[t]
	tr.free += k
	if tr.free == TrayGPUs {
		c.cliques[tr.clique].empty++
	}
}

// view is the cliques as placement.ChooseClique sees them for a group of pods of k GPUs.
func (c *rackCluster) view(k int) []placement.Clique {
	out := make([]placement.Clique, len(c.cliques))
	for i, cl := range c.cliques {
		nodes := make([]placement.CliqueNode, len(cl.trays))
		for j, t := range cl.trays {
			tr := c.trays[t]
			nodes[j] = placement.CliqueNode{Name: tr.name, Slots: placement.SlotsFor(k, []int{tr.free}),
				MaxSlots: placement.SlotsFor(k, []int{TrayGPUs}), GPUs: TrayGPUs, Free: tr.free}
		}
		out[i] = placement.Clique{ID: cl.id, Nodes: nodes}
	}
	return out
}

// CliqueJob is one request of a rack trace: a group of Pods pods of GPUs GPUs each, every pod
// a whole tray, or a single-node TP pod (Group false, Pods 1).
type CliqueJob struct {
	ID                int
	Group             bool
	Pods, GPUs        int
	Arrival, Duration float64
}

// TotalGPUs is the GPUs the job holds while it runs.
func (j CliqueJob) TotalGPUs() int { return j.Pods * j.GPUs }

// RackWork shapes a rack trace: Poisson arrivals, exponential durations.
type RackWork struct {
	// GroupShare is the share of the offered GPU-time that groups bring.
	GroupShare float64
	// GroupPods are the group sizes, in pods of TrayGPUs GPUs (trays), equally likely.
	GroupPods []int
	// Singles is the mix of single-node pods by GPU count, by share of their number.
	Singles      []SizeShare
	MeanDuration float64
}

// DefaultRackWork is the report's work. Half of the GPU demand comes from groups of 2 to 8
// trays, equally likely (20 GPUs on average), half from single-node TP pods of 1, 2 and 4 GPUs
// (PoolMix, 40/30/30 by count: a tray is a 4-GPU domain, as the split pool's nodes are). Half
// and half because that is where clique choice matters most: with groups alone, placement is
// bin packing of whole trays and any policy that keeps groups whole does about as well; with
// singles alone there is nothing to split. By count, a group is then about 1 job in 10, and
// the singles, 9 in 10, are what scatters used GPUs over the trays. A one-tray group is a
// single 4-GPU pod to every policy, so it is in the singles' mix, not the groups'. Groups and
// singles last 10 time units on average alike, so the load split is also the GPU split.
var DefaultRackWork = RackWork{GroupShare: 0.5, GroupPods: []int{2, 3, 4, 5, 6, 7, 8}, Singles: PoolMix, MeanDuration: 10}

// RackTrace draws work whose offered load is load × gpus over horizon: groups and singles are
// two Poisson streams, superposed as one stream whose arrivals are groups with the groups'
// share of the rate. IDs follow arrival order.
func RackTrace(seed uint64, gpus int, load, horizon float64, w RackWork) []CliqueJob {
	if load <= 0 || len(w.GroupPods) == 0 || len(w.Singles) == 0 {
		return nil
	}
	meanGroup := 0.0
	for _, p := range w.GroupPods {
		meanGroup += float64(p*TrayGPUs) / float64(len(w.GroupPods))
	}
	groupRate := w.GroupShare * load * float64(gpus) / (meanGroup * w.MeanDuration)
	singleRate := (1 - w.GroupShare) * load * float64(gpus) / (meanSize(w.Singles) * w.MeanDuration)
	rate := groupRate + singleRate
	rng := rand.New(rand.NewPCG(seed, 0x4e564c3732))
	var jobs []CliqueJob
	t := 0.0
	for id := 0; ; id++ {
		t += rng.ExpFloat64() / rate
		if t > horizon {
			return jobs
		}
		j := CliqueJob{ID: id, Arrival: t, Pods: 1, GPUs: TrayGPUs}
		if rng.Float64() < groupRate/rate {
			j.Group, j.Pods = true, w.GroupPods[rng.IntN(len(w.GroupPods))]
		} else {
			u := rng.Float64()
			j.GPUs = w.Singles[len(w.Singles)-1].Size
			for _, s := range w.Singles {
				if u < s.Share {
					j.GPUs = s.Size
					break
				}
				u -= s.Share
			}
		}
		j.Duration = rng.ExpFloat64() * w.MeanDuration
		jobs = append(jobs, j)
	}
}

// RackPolicy places a rack trace. Its methods are the simulator's hooks, so only this
// package's policies implement it.
type RackPolicy interface {
	Name() string
	// arrive is called once when j arrives, before the scheduling pass that follows; false
	// rejects the job (it could never run).
	arrive(s *rackSim, j *rackJob) bool
	// try places what it can of a waiting job; true once every pod of it is placed.
	try(s *rackSim, j *rackJob) bool
	// settle runs after every scheduling pass: a controller beside the scheduler.
	settle(s *rackSim, now float64)
}

// WaitSum adds up waits.
type WaitSum struct {
	Sum float64
	N   int
}

func (w *WaitSum) add(x float64) { w.Sum += x; w.N++ }

// Mean is the mean wait, 0 over none.
func (w WaitSum) Mean() float64 {
	if w.N == 0 {
		return 0
	}
	return w.Sum / float64(w.N)
}

// RackResult is one policy on one layout at one load, for one seed or merged over several
// (MergeRackResults).
type RackResult struct {
	Layout, Policy string
	Load           float64
	Seeds          int
	Jobs, Groups   int
	// Busy is the GPU-time of running jobs inside the measurement window [warmup, horizon],
	// and Capacity the cluster's GPU-time there. A group's GPUs count from when its last pod
	// is placed: GPUs a partly placed group holds are idle.
	Busy, Capacity float64
	// GroupWait and SingleWait are the waits of jobs arriving after warmup, from arrival to
	// the placement of their last pod. A job still waiting at the horizon counts with the
	// wait it had by then (a lower bound), so a policy cannot look fast by starving the
	// groups it never places.
	GroupWait, SingleWait WaitSum
	// Split counts groups started with pods in more than one clique, of GroupsStarted.
	Split, GroupsStarted int
	// NeverPlaced counts jobs rejected at arrival or not started by the horizon (NeverGroups
	// of them groups). Every job of the trace is started or counted here.
	NeverPlaced, NeverGroups int
	Started                  int
	// Repins counts waiting groups moved to another clique (nvdomain's never-strand rule).
	Repins int
}

// Utilisation is Busy / Capacity.
func (r RackResult) Utilisation() float64 {
	if r.Capacity == 0 {
		return 0
	}
	return r.Busy / r.Capacity
}

// AllWait is the mean wait over groups and singles.
func (r RackResult) AllWait() float64 {
	return WaitSum{r.GroupWait.Sum + r.SingleWait.Sum, r.GroupWait.N + r.SingleWait.N}.Mean()
}

// MergeRackResults adds up runs of one policy on one layout and load (several seeds): sums
// and counts add, so the means and utilisation are over every job of every run.
func MergeRackResults(rs []RackResult) RackResult {
	var m RackResult
	for i, r := range rs {
		if i == 0 {
			m.Layout, m.Policy, m.Load = r.Layout, r.Policy, r.Load
		}
		m.Seeds += max(r.Seeds, 1)
		m.Jobs += r.Jobs
		m.Groups += r.Groups
		m.Busy += r.Busy
		m.Capacity += r.Capacity
		m.GroupWait.Sum += r.GroupWait.Sum
		m.GroupWait.N += r.GroupWait.N
		m.SingleWait.Sum += r.SingleWait.Sum
		m.SingleWait.N += r.SingleWait.N
		m.Split += r.Split
		m.GroupsStarted += r.GroupsStarted
		m.NeverPlaced += r.NeverPlaced
		m.NeverGroups += r.NeverGroups
		m.Started += r.Started
		m.Repins += r.Repins
	}
	return m
}

// rackJob is a job of the trace as the simulation follows it.
type rackJob struct {
	*CliqueJob
	// trays are the trays its placed pods are on, one entry per pod.
	trays   []int
	started bool
	start   float64
}

type rackEnd struct {
	t   float64
	job *rackJob
}

type rackEnds []rackEnd

func (h rackEnds) Len() int           { return len(h) }
func (h rackEnds) Less(i, j int) bool { return h[i].t < h[j].t }
func (h rackEnds) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *rackEnds) Push(x any)        { *h = append(*h, x.(rackEnd)) }
func (h *rackEnds) Pop() any          { o := *h; e := o[len(o)-1]; *h = o[:len(o)-1]; return e }

// rackSim is one run.
type rackSim struct {
	p               RackPolicy
	c               *rackCluster
	rng             *rand.Rand
	horizon, warmup float64
	queue           []*rackJob // waiting, in arrival order
	holding         []*rackJob // started, or holding trays for some pods
	ends            rackEnds
	res             RackResult
	// noRoom[k] says, within one scheduling pass, that no tray has k GPUs free: placing only
	// takes room, so a size that failed once fails for the rest of the pass, and long queues
	// at high load do not make a pass cost queue × trays.
	noRoom [TrayGPUs + 1]bool
	// onStart, when set (tests), sees every job as it starts.
	onStart func(j *rackJob)
}

// RunRacks replays jobs on a fresh cluster of the layout under p. Waiting jobs are tried in
// arrival order whenever GPUs free up or a job arrives, and any job that fits starts: a job
// that cannot start does not block those behind it (backfill, as the scheduler's queue and
// Kueue's BestEffortFIFO do). Utilisation and waits are measured over [warmup, horizon].
// The run checks its own bookkeeping after every event (no tray over capacity or below zero,
// every clique's count of empty trays right, every held GPU owned by a job) and returns an
// error at the first event that breaks it.
func RunRacks(p RackPolicy, l RackLayout, jobs []CliqueJob, horizon, warmup float64, seed uint64) (RackResult, error) {
	return runRacks(p, l, jobs, horizon, warmup, seed, nil)
}

func runRacks(p RackPolicy, l RackLayout, jobs []CliqueJob, horizon, warmup float64, seed uint64, onStart func(*rackJob)) (RackResult, error) {
	s := &rackSim{p: p, c: l.build(), rng: rand.New(rand.NewPCG(seed, 11)), horizon: horizon, warmup: warmup, onStart: onStart,
		res: RackResult{Layout: l.Name, Policy: p.Name(), Seeds: 1, Capacity: float64(l.GPUs()) * (horizon - warmup)}}
	next := 0
	for {
		tEnd, tArr := math.Inf(1), math.Inf(1)
		if len(s.ends) > 0 {
			tEnd = s.ends[0].t
		}
		if next < len(jobs) {
			tArr = jobs[next].Arrival
		}
		// GPUs freed at an instant are offered to the queue before that instant's arrivals.
		t := min(tEnd, tArr)
		if t > horizon || math.IsInf(t, 1) {
			break
		}
		if t == tEnd {
			s.release(heap.Pop(&s.ends).(rackEnd).job)
		} else {
			j := &rackJob{CliqueJob: &jobs[next]}
			next++
			s.res.Jobs++
			if j.Group {
				s.res.Groups++
			}
			if !s.p.arrive(s, j) {
				s.never(j)
				continue
			}
			s.queue = append(s.queue, j)
		}
		s.pass(t)
		s.p.settle(s, t)
		if err := s.audit(); err != nil {
			return s.res, fmt.Errorf("%s on %s at t=%.3f: %w", p.Name(), l.Name, t, err)
		}
	}
	for _, j := range s.queue {
		s.never(j)
		if j.Arrival >= warmup {
			s.waitOf(j).add(horizon - j.Arrival)
		}
	}
	// Jobs of the trace after the horizon never arrive: they are neither started nor counted.
	return s.res, nil
}

func (s *rackSim) never(j *rackJob) {
	s.res.NeverPlaced++
	if j.Group {
		s.res.NeverGroups++
	}
}

func (s *rackSim) waitOf(j *rackJob) *WaitSum {
	if j.Group {
		return &s.res.GroupWait
	}
	return &s.res.SingleWait
}

// pass tries every waiting job in arrival order and starts those that get every pod placed.
func (s *rackSim) pass(now float64) {
	s.noRoom = [TrayGPUs + 1]bool{}
	kept := s.queue[:0]
	for _, j := range s.queue {
		if s.p.try(s, j) {
			s.start(j, now)
			continue
		}
		kept = append(kept, j)
	}
	clear(s.queue[len(kept):])
	s.queue = kept
}

// place puts one more pod of j on tray t.
func (s *rackSim) place(j *rackJob, t int) {
	if len(j.trays) == 0 {
		s.holding = append(s.holding, j)
	}
	s.c.take(t, j.GPUs)
	j.trays = append(j.trays, t)
}

// withRoom lists the trays with k GPUs free, in tray order; nil when none has (and then, for
// the rest of the pass, without looking).
func (s *rackSim) withRoom(k int) []int {
	if s.noRoom[k] {
		return nil
	}
	var out []int
	for t, tr := range s.c.trays {
		if tr.free >= k {
			out = append(out, t)
		}
	}
	if len(out) == 0 {
		for m := k; m <= TrayGPUs; m++ {
			s.noRoom[m] = true
		}
	}
	return out
}

// start runs a job every pod of which is placed.
func (s *rackSim) start(j *rackJob, now float64) {
	j.started, j.start = true, now
	s.res.Started++
	end := now + j.Duration
	heap.Push(&s.ends, rackEnd{end, j})
	if lo, hi := math.Max(now, s.warmup), math.Min(end, s.horizon); hi > lo {
		s.res.Busy += (hi - lo) * float64(j.TotalGPUs())
	}
	if j.Arrival >= s.warmup {
		s.waitOf(j).add(now - j.Arrival)
	}
	if j.Group {
		s.res.GroupsStarted++
		if s.cliquesOf(j) > 1 {
			s.res.Split++
		}
	}
	if s.onStart != nil {
		s.onStart(j)
	}
}

// cliquesOf is how many cliques j's pods are in.
func (s *rackSim) cliquesOf(j *rackJob) int {
	var seen []int
	for _, t := range j.trays {
		if c := s.c.trays[t].clique; !slices.Contains(seen, c) {
			seen = append(seen, c)
		}
	}
	return len(seen)
}

func (s *rackSim) release(j *rackJob) {
	for _, t := range j.trays {
		s.c.give(t, j.GPUs)
	}
	j.trays = nil
	s.holding = slices.DeleteFunc(s.holding, func(h *rackJob) bool { return h == j })
}

// audit checks the cluster against the jobs holding trays.
func (s *rackSim) audit() error {
	held := make([]int, len(s.c.trays))
	for _, j := range s.holding {
		if len(j.trays) > j.Pods {
			return fmt.Errorf("job %d has %d pods placed, of %d", j.ID, len(j.trays), j.Pods)
		}
		if j.started && len(j.trays) != j.Pods {
			return fmt.Errorf("job %d started with %d of its %d pods placed", j.ID, len(j.trays), j.Pods)
		}
		for _, t := range j.trays {
			held[t] += j.GPUs
		}
	}
	for i, cl := range s.c.cliques {
		empty := 0
		for _, t := range cl.trays {
			tr := s.c.trays[t]
			if tr.free < 0 || tr.free > TrayGPUs {
				return fmt.Errorf("tray %s has %d of %d GPUs free", tr.name, tr.free, TrayGPUs)
			}
			if held[t]+tr.free != TrayGPUs {
				return fmt.Errorf("tray %s: jobs hold %d GPUs and %d are free, of %d", tr.name, held[t], tr.free, TrayGPUs)
			}
			if tr.clique != i {
				return fmt.Errorf("tray %s is listed in clique %s but labelled %s", tr.name, cl.id, s.c.cliques[tr.clique].id)
			}
			if tr.free == TrayGPUs {
				empty++
			}
		}
		if empty != cl.empty {
			return fmt.Errorf("clique %s counts %d empty trays, has %d", cl.id, cl.empty, empty)
		}
	}
	return nil
}

// CliqueBlind is the stock kube-scheduler with no group constraint, as a LeaderWorkerSet
// without an exclusive-topology annotation gets: every pod of a group is scheduled on its own,
// in order (the leader, then its workers), on any tray with room. The default scores
// (NodeResourcesFit's LeastAllocated and NodeResourcesBalancedAllocation) weigh CPU and memory,
// not nvidia.com/gpu, so among the trays with room the choice is arbitrary as far as GPUs go:
// uniform at random, as NodeCountOnly models it. A group starts when its last pod is placed,
// and the pods placed before hold their trays idle meanwhile.
type CliqueBlind struct{}

func (CliqueBlind) Name() string                    { return "clique-blind" }
func (CliqueBlind) arrive(*rackSim, *rackJob) bool  { return true }
func (CliqueBlind) settle(*rackSim, float64)        {}
func (CliqueBlind) try(s *rackSim, j *rackJob) bool { return placeAnywhere(s, j) }

// placeAnywhere places j's pods not yet placed, each on a tray with room drawn at random, as
// many as there is room for.
func placeAnywhere(s *rackSim, j *rackJob) bool {
	for len(j.trays) < j.Pods {
		room := s.withRoom(j.GPUs)
		if len(room) == 0 {
			return false
		}
		s.place(j, room[s.rng.IntN(len(room))])
	}
	return true
}

// LabelGang is label-level gang placement, first fit, as KAI Scheduler's topology-aware
// gangs or Kueue's Topology Aware Scheduling with a required clique level place a group: the
// group is admitted only when one clique, taken in a fixed order (label value), has an empty
// tray for every pod, and then all its pods go there at once. A group that cannot be admitted
// does not block the jobs behind it (Kueue's BestEffortFIFO; the pass is backfill). Single
// pods bin-pack: the tray with the fewest GPUs free that fits, the first such tray on a tie
// (KAI's default binpack strategy; Kueue TAS's BestFit for a one-pod workload).
type LabelGang struct{}

func (LabelGang) Name() string                   { return "label-level gang (first fit)" }
func (LabelGang) arrive(*rackSim, *rackJob) bool { return true }
func (LabelGang) settle(*rackSim, float64)       {}

func (LabelGang) try(s *rackSim, j *rackJob) bool {
	if !j.Group {
		t, ok := binpack(s, j.GPUs)
		if ok {
			s.place(j, t)
		}
		return ok
	}
	for i, cl := range s.c.cliques {
		if cl.empty >= j.Pods {
			placeGroupIn(s, j, i)
			return true
		}
	}
	return false
}

// binpack is the tray with the fewest GPUs free of those with k free, the first on a tie.
func binpack(s *rackSim, k int) (int, bool) {
	best := -1
	for _, t := range s.withRoom(k) {
		if best < 0 || s.c.trays[t].free < s.c.trays[best].free {
			best = t
		}
	}
	return best, best >= 0
}

// placeGroupIn places every pod of group j on empty trays of clique c, the first ones: a group
// pod takes a whole tray, so which empty trays it takes makes no difference to anyone.
func placeGroupIn(s *rackSim, j *rackJob, c int) {
	for _, t := range s.c.cliques[c].trays {
		if len(j.trays) == j.Pods {
			return
		}
		if s.c.trays[t].free == TrayGPUs {
			s.place(j, t)
		}
	}
}

// Names of nvdomain's two rows.
const (
	// PolicyNvdomain is nvdomain as it ships: a group pinned to its clique at admission.
	PolicyNvdomain = "nvdomain"
	// PolicyNvdomainPodGroup is nvdomain with Kubernetes' Workload API gang scheduling on.
	PolicyNvdomainPodGroup = "nvdomain + Workload API (PodGroup gang, topology on the clique label)"
	// PolicyNvdomainPodGroupBinPack is the Workload API path on a scheduler whose profile
	// bin-packs GPUs (NodeResourcesFit MostAllocated on nvidia.com/gpu), as the gang
	// schedulers pack their singles.
	PolicyNvdomainPodGroupBinPack = "nvdomain + Workload API, scheduler bin-packing GPUs (MostAllocated)"
)

// NvdomainCliques is nvdomain on NVL72 racks, production code for every choice except where
// this comment says the rule is mirrored.
//
// Groups, as production ships (PodGroup false): a group is pinned on arrival to
// placement.ChooseClique's clique (its seed the admission's, as the webhook's), given the GPUs
// of the groups already pinned to each clique and waiting: when the clique has room for every
// pod now the group is placed there; otherwise it waits for that clique, all its pods at once
// when it has room (the model assumes the group is admitted whole, as a gang gated on its
// clique; it does not model pods of a group placed one by one inside the clique). The
// never-strand rule: after every scheduling pass, a waiting group whose pinned clique cannot
// hold it now while another clique can is re-chosen as a whole by ChooseClique, which then
// finds a fit (the re-pin; at once, with no grace period, which flatters production's
// controller). The re-pin is a controller beside the scheduler: it acts only after the
// scheduler has placed the pods already pending, so the singles behind a stranded group in
// the queue take the room first.
//
// Groups with the Workload API (PodGroup true; KEP-4671 gang scheduling with KEP-5732's
// topology-aware workload scheduling, alpha/beta feature gates in Kubernetes 1.36/1.37):
// nvdomain creates the group's PodGroup with minCount the group's size and topology key
// nvidia.com/gpu.clique, and pins nothing at admission. The stock scheduler then places the
// whole group at its place in the queue, into one clique that has room for every pod now, or
// leaves it waiting (the pods behind it go on: the pass is backfill). Which of the fitting
// cliques it takes is modelled as placement.ChooseClique's tightest fit (nvdomain keeping its
// role of hinting or scoring the clique): an assumption, since upstream scores a placement
// with its own plugin (podgrouppodscount), not by the tightest fit. No pin, so no line and no
// re-pin.
//
// A single-node pod, in both modes, gets what the webhook now decides for a pod in no group:
// the most fragmented clique with room (fragmentedClique, which mirrors
// clusterview.(*View).FragmentedClique's rule), then the domain decision restricted to that
// clique's trays (placement.DomainChooser, seeded per admission); when no clique has room, or
// none fits there, the decision over every tray, as pkg/admission's plan falls back to. When
// the decision fits, the scheduler places the pod on a tray the decision's hint names (the
// tightest fits, up to placement.MaxHintNodes of them) that still has room, at random among
// those, as Nvdomain's model of the preferred node affinity does; a pod whose hinted trays are
// taken, or that waited (no fit at admission: no hint), goes to any tray with room at random.
type NvdomainCliques struct {
	// PodGroup models the Workload API path (PolicyNvdomainPodGroup); the zero value is
	// production's pin at admission (PolicyNvdomain).
	PodGroup bool
	// BinPack (with PodGroup: PolicyNvdomainPodGroupBinPack) models a scheduler profile
	// that scores nodes by MostAllocated on nvidia.com/gpu: a single goes to the tray with
	// the fewest free GPUs that fit (the first on a tie), whatever the webhook hinted, as
	// LabelGang packs its singles. The default profile (LeastAllocated) is modelled as a
	// random tray among the hinted ones, then among all.
	BinPack bool

	// pin is the clique each group not yet placed is pinned to, by job ID; attempts counts a
	// job's admissions (a re-pinned group's pods are new pods, with new seeds).
	pin      map[int]groupPin
	attempts map[int]int
	// waiting and waitingPods are the GPUs and pods of the groups pinned to each clique, by
	// label value, and waiting.
	waiting, waitingPods map[string]int
	// hint is the trays a single pod's decision named, by job ID.
	hint map[int][]int
	// index maps tray names (as the chooser names them) to trays.
	index map[string]int
}

// groupPin is a group's clique (index) and whether it joined that clique's line: only a
// group with no room on admission did.
type groupPin struct {
	clique int
	inLine bool
}

func (p *NvdomainCliques) Name() string {
	switch {
	case p.PodGroup && p.BinPack:
		return PolicyNvdomainPodGroupBinPack
	case p.PodGroup:
		return PolicyNvdomainPodGroup
	}
	return PolicyNvdomain
}

func (p *NvdomainCliques) ready(s *rackSim) {
	if p.pin != nil {
		return
	}
	p.pin, p.attempts, p.hint = map[int]groupPin{}, map[int]int{}, map[int][]int{}
	p.waiting, p.waitingPods = map[string]int{}, map[string]int{}
	p.index = make(map[string]int, len(s.c.trays))
	for t, tr := range s.c.trays {
		p.index[tr.name] = t
	}
}

func (p *NvdomainCliques) arrive(s *rackSim, j *rackJob) bool {
	p.ready(s)
	switch {
	case j.Group && p.PodGroup:
		// A group no clique could ever hold is refused (ChooseClique's ImpossibleGroupError).
		return slices.ContainsFunc(s.c.cliques, func(cl rackClique) bool { return len(cl.trays) >= j.Pods })
	case j.Group:
		return p.pinGroup(s, j) == nil
	}
	seed := admissionSeed(j.ID, p.attempts[j.ID])
	p.attempts[j.ID]++
	// As pkg/admission's plan: the decision inside the fragmented clique when it fits there,
	// else the decision over every tray (no clique has room: a decision to wait).
	if c := p.fragmentedClique(s, j.GPUs); c >= 0 {
		if dec, err := p.decideSingle(s, j.GPUs, c, seed); err == nil && dec.Fits {
			return p.recordHint(j, dec) == nil
		}
	}
	dec, err := p.decideSingle(s, j.GPUs, -1, seed)
	if err != nil {
		return false
	}
	return p.recordHint(j, dec) == nil
}

// decideSingle is the webhook's domain decision for a pod of k GPUs over clique c's trays, or
// over every tray when c < 0.
func (p *NvdomainCliques) decideSingle(s *rackSim, k, c int, seed uint64) (placement.Decision, error) {
	ch := placement.NewDomainChooser(k).Spread(seed)
	consider := func(t int) {
		tr := s.c.trays[t]
		ch.ConsiderNodes(placement.Candidate{Node: tr.name, Domain: 0, Capacity: TrayGPUs, Free: tr.free}, 1, tr.name)
	}
	if c >= 0 {
		for _, t := range s.c.cliques[c].trays {
			consider(t)
		}
	} else {
		for t := range s.c.trays {
			consider(t)
		}
	}
	return ch.Decide()
}

// recordHint keeps the trays a fitting decision's hint names.
func (p *NvdomainCliques) recordHint(j *rackJob, dec placement.Decision) error {
	if !dec.Fits {
		return nil
	}
	for _, name := range dec.Hint {
		t, ok := p.index[name]
		if !ok {
			return fmt.Errorf("single %d: hint names %q, no tray", j.ID, name)
		}
		p.hint[j.ID] = append(p.hint[j.ID], t)
	}
	return nil
}

// fragmentedClique is the clique (index; -1 when none has room) where a pod of k GPUs in no
// group is placed. It mirrors clusterview.(*View).FragmentedClique, whose view is built from
// Kubernetes objects and too dear to rebuild per pod here, rule for rule (TestFragmentedClique
// checks the mirror against it): among the cliques where some tray has a slot for the pod,
// the fewest empty trays, then the most free GPUs on trays in use, then the first in label
// order; groups waiting for a clique do not count.
func (p *NvdomainCliques) fragmentedClique(s *rackSim, k int) int {
	best, bestEmpty, bestPartial := -1, 0, 0
	for i, cl := range s.c.cliques {
		room, empty, partial := false, 0, 0
		for _, t := range cl.trays {
			f := s.c.trays[t].free
			room = room || placement.SlotsFor(k, []int{f}) > 0
			if f == TrayGPUs {
				empty++
			} else {
				partial += f
			}
		}
		if !room {
			continue
		}
		if best < 0 || empty < bestEmpty || (empty == bestEmpty && partial > bestPartial) {
			best, bestEmpty, bestPartial = i, empty, partial
		}
	}
	return best
}

// pinGroup is the webhook's clique decision for the group's next admission, recorded: its
// pin, and its place in that clique's line while it waits.
func (p *NvdomainCliques) pinGroup(s *rackSim, j *rackJob) error {
	p.unpin(s, j)
	seed := admissionSeed(j.ID, p.attempts[j.ID])
	p.attempts[j.ID]++
	dec, err := placement.ChooseClique(placement.Group{Pods: j.Pods, GPUsPerPod: j.GPUs}, s.c.view(j.GPUs), p.waiting, seed)
	if err != nil {
		return fmt.Errorf("group %d: %w", j.ID, err)
	}
	c := slices.IndexFunc(s.c.cliques, func(cl rackClique) bool { return cl.id == dec.Clique })
	p.pin[j.ID] = groupPin{clique: c, inLine: !dec.Fits}
	if !dec.Fits {
		p.waiting[dec.Clique] += j.TotalGPUs()
		p.waitingPods[dec.Clique] += j.Pods
	}
	return nil
}

// unpin takes a group that is placed or re-pinned out of its clique's line, if it is in one.
func (p *NvdomainCliques) unpin(s *rackSim, j *rackJob) {
	if pin, ok := p.pin[j.ID]; ok && pin.inLine {
		id := s.c.cliques[pin.clique].id
		p.waiting[id] -= j.TotalGPUs()
		p.waitingPods[id] -= j.Pods
	}
	delete(p.pin, j.ID)
}

// stranded says whether a waiting group's pinned clique cannot hold it now while another can.
func (p *NvdomainCliques) stranded(s *rackSim, j *rackJob) bool {
	return s.c.cliques[p.pin[j.ID].clique].empty < j.Pods &&
		slices.ContainsFunc(s.c.cliques, func(cl rackClique) bool { return cl.empty >= j.Pods })
}

func (p *NvdomainCliques) try(s *rackSim, j *rackJob) bool {
	if j.Group && p.PodGroup {
		return p.placePodGroup(s, j)
	}
	if j.Group {
		c := p.pin[j.ID].clique
		if s.c.cliques[c].empty < j.Pods {
			return false
		}
		p.unpin(s, j)
		placeGroupIn(s, j, c)
		return true
	}
	defer delete(p.hint, j.ID)
	if p.BinPack {
		t, ok := binpack(s, j.GPUs)
		if ok {
			s.place(j, t)
		}
		return ok
	}
	room := s.withRoom(j.GPUs)
	if len(room) == 0 {
		return false
	}
	var hinted []int
	for _, t := range p.hint[j.ID] {
		if s.c.trays[t].free >= j.GPUs {
			hinted = append(hinted, t)
		}
	}
	if len(hinted) > 0 {
		room = hinted
	}
	s.place(j, room[s.rng.IntN(len(room))])
	return true
}

// placePodGroup is the gang scheduler's turn for a group at its place in the queue: all its
// pods into the tightest clique (ChooseClique, no line: nothing is pinned) with room for
// every one of them now, or none.
func (p *NvdomainCliques) placePodGroup(s *rackSim, j *rackJob) bool {
	if !slices.ContainsFunc(s.c.cliques, func(cl rackClique) bool { return cl.empty >= j.Pods }) {
		return false
	}
	dec, err := placement.ChooseClique(placement.Group{Pods: j.Pods, GPUsPerPod: j.GPUs}, s.c.view(j.GPUs), nil, admissionSeed(j.ID, 0))
	if err != nil || !dec.Fits {
		return false // unreachable: a clique has an empty tray for every pod
	}
	placeGroupIn(s, j, slices.IndexFunc(s.c.cliques, func(cl rackClique) bool { return cl.id == dec.Clique }))
	return true
}

// settle is the never-strand rule, waiters in queue order, so that an earlier group takes
// the room it is moved to before a later one is judged. The Workload API path pins nothing.
func (p *NvdomainCliques) settle(s *rackSim, now float64) {
	if p.pin == nil || p.PodGroup {
		return
	}
	kept := s.queue[:0]
	for _, j := range s.queue {
		if !j.Group || !p.stranded(s, j) {
			kept = append(kept, j)
			continue
		}
		if err := p.pinGroup(s, j); err != nil || !p.try(s, j) {
			// Unreachable: a clique has room, so ChooseClique finds a fit there.
			kept = append(kept, j)
			continue
		}
		s.res.Repins++
		s.start(j, now)
	}
	clear(s.queue[len(kept):])
	s.queue = kept
}

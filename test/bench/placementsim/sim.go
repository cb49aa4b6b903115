// Package placementsim replays a seeded job trace on a simulated GPU cluster under several
// placement policies and measures what each buys: how many tensor-parallel jobs get GPUs that
// span NVLink domains, GPU utilisation, queueing delay and jobs never placed. nvdomain's
// policy runs the production code (pkg/placement); the others model today's alternatives.
package placementsim

import (
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"

	"github.com/nvdomain/nvdomain/pkg/placement"
)

// NodeKind is a machine shape.
type NodeKind int

const (
	// HGX8 is one 8-GPU NVSwitch domain (HGX/DGX H100).
	HGX8 NodeKind = iota
	// Split2x4 is two NVSwitch islands of 4 GPUs.
	Split2x4
	// Bridged4x2 is a PCIe box with NVLink bridges on 4 pairs (direct GPU-GPU links).
	Bridged4x2
)

// Node is one simulated machine.
type Node struct {
	Kind    NodeKind
	Domains [][]int // GPU indexes per domain
	used    map[int]bool
}

func newNode(k NodeKind) *Node {
	n := &Node{Kind: k, used: map[int]bool{}}
	switch k {
	case HGX8:
		n.Domains = [][]int{{0, 1, 2, 3, 4, 5, 6, 7}}
	case Split2x4:
		n.Domains = [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}
	case Bridged4x2:
		n.Domains = [][]int{{0, 1}, {2, 3}, {4, 5}, {6, 7}}
	}
	return n
}

func (n *Node) free() int {
	c := 0
	for g := range 8 {
		if !n.used[g] {
			c++
		}
	}
	return c
}

func (n *Node) domainFree(d int) int {
	c := 0
	for _, g := range n.Domains[d] {
		if !n.used[g] {
			c++
		}
	}
	return c
}

func (n *Node) domainOf(g int) int {
	for d, gs := range n.Domains {
		if slices.Contains(gs, g) {
			return d
		}
	}
	return -1
}

// Cluster is the mixed 64-node cluster of the issue: HGX, 2×4 split and bridged-pair nodes.
func Cluster(hgx, split, bridged int) []*Node {
	var out []*Node
	for range hgx {
		out = append(out, newNode(HGX8))
	}
	for range split {
		out = append(out, newNode(Split2x4))
	}
	for range bridged {
		out = append(out, newNode(Bridged4x2))
	}
	return out
}

// Job is one request in the trace.
type Job struct {
	ID       int
	Size     int
	Arrival  float64
	Duration float64
}

// SizeMix is the share of jobs of each GPU count: mostly small inference replicas, some TP=4
// and TP=8 (70B-class models).
var SizeMix = []struct {
	Size  int
	Share float64
}{{1, 0.40}, {2, 0.30}, {4, 0.20}, {8, 0.10}}

func meanSize() float64 {
	m := 0.0
	for _, s := range SizeMix {
		m += float64(s.Size) * s.Share
	}
	return m
}

// Trace draws Poisson arrivals whose offered load is load × the cluster's GPUs, with
// exponential durations of mean meanDuration, over horizon.
func Trace(seed uint64, gpus int, load, meanDuration, horizon float64) []Job {
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	rate := load * float64(gpus) / (meanSize() * meanDuration)
	var jobs []Job
	t := 0.0
	for id := 0; ; id++ {
		t += rng.ExpFloat64() / rate
		if t > horizon {
			return jobs
		}
		u, size := rng.Float64(), SizeMix[len(SizeMix)-1].Size
		for _, s := range SizeMix {
			if u < s.Share {
				size = s.Size
				break
			}
			u -= s.Share
		}
		jobs = append(jobs, Job{ID: id, Size: size, Arrival: t, Duration: rng.ExpFloat64() * meanDuration})
	}
}

// Policy decides where a job runs.
type Policy interface {
	Name() string
	// Admit is called once on arrival; false means the job is rejected outright (it could
	// never run). It may pin the job (nvdomain's domain id).
	Admit(j *Job, nodes []*Node) bool
	// Place returns the node and GPUs for a queued job, or ok=false to keep it waiting.
	Place(j *Job, nodes []*Node, rng *rand.Rand) (node int, gpus []int, ok bool)
	// FitKey groups jobs that fit exactly where each other fit (same size, same pin), so a
	// pass over the queue tries each group once after its first failure.
	FitKey(j *Job) int
}

// Result is one policy at one load.
type Result struct {
	Policy         string
	Load           float64
	Jobs           int
	TPJobs         int
	CrossDomainPct float64 // of placed jobs of size ≥ 2
	Utilisation    float64 // busy GPU-time / (GPUs × measured time)
	MeanWait       float64
	P95Wait        float64
	NeverPlaced    int // rejected at admission or still waiting at the end
	Rejected       int
}

type event struct {
	t    float64
	node int
	gpus []int
}

type eventHeap []event

func (h eventHeap) Len() int           { return len(h) }
func (h eventHeap) Less(i, j int) bool { return h[i].t < h[j].t }
func (h eventHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)        { *h = append(*h, x.(event)) }
func (h *eventHeap) Pop() any          { o := *h; e := o[len(o)-1]; *h = o[:len(o)-1]; return e }

// Run replays jobs under a policy. Waiting jobs are retried in arrival order whenever GPUs
// free up, like the scheduler's queue; any job that fits starts (backfill). Utilisation and
// waits are measured on jobs arriving after warmup.
func Run(p Policy, mkNodes func() []*Node, jobs []Job, horizon, warmup float64, seed uint64) Result {
	nodes := mkNodes()
	rng := rand.New(rand.NewPCG(seed, 7))
	gpus := 8 * len(nodes)
	var ends eventHeap
	var queue []*Job
	res := Result{Policy: p.Name()}
	var waits []float64
	busy := 0.0
	cross, tpPlaced := 0, 0
	measured := horizon - warmup
	account := func(start, end float64, k int) {
		lo, hi := math.Max(start, warmup), math.Min(end, horizon)
		if hi > lo {
			busy += (hi - lo) * float64(k)
		}
	}
	tryQueue := func(now float64) {
		kept := queue[:0]
		// Placing a job only takes GPUs away, so a group that failed once in a pass fails for
		// the rest of it; without this, long queues at overload make the run quadratic.
		failed := map[int]bool{}
		for _, j := range queue {
			key := p.FitKey(j)
			if failed[key] {
				kept = append(kept, j)
				continue
			}
			ni, gs, ok := p.Place(j, nodes, rng)
			if !ok {
				failed[key] = true
				kept = append(kept, j)
				continue
			}
			for _, g := range gs {
				nodes[ni].used[g] = true
			}
			heap.Push(&ends, event{now + j.Duration, ni, gs})
			account(now, now+j.Duration, j.Size)
			if j.Arrival >= warmup {
				waits = append(waits, now-j.Arrival)
			}
			if j.Size >= 2 {
				tpPlaced++
				d := nodes[ni].domainOf(gs[0])
				for _, g := range gs {
					if nodes[ni].domainOf(g) != d || d < 0 {
						cross++
						break
					}
				}
			}
		}
		queue = kept
	}
	for i := range jobs {
		j := &jobs[i]
		for ends.Len() > 0 && ends[0].t <= j.Arrival {
			e := heap.Pop(&ends).(event)
			for _, g := range e.gpus {
				delete(nodes[e.node].used, g)
			}
			tryQueue(e.t)
		}
		res.Jobs++
		if j.Size >= 2 {
			res.TPJobs++
		}
		if !p.Admit(j, nodes) {
			res.Rejected++
			continue
		}
		queue = append(queue, j)
		tryQueue(j.Arrival)
	}
	for ends.Len() > 0 && ends[0].t <= horizon {
		e := heap.Pop(&ends).(event)
		for _, g := range e.gpus {
			delete(nodes[e.node].used, g)
		}
		tryQueue(e.t)
	}
	res.NeverPlaced = res.Rejected + len(queue)
	if tpPlaced > 0 {
		res.CrossDomainPct = 100 * float64(cross) / float64(tpPlaced)
	}
	res.Utilisation = busy / (float64(gpus) * measured)
	if len(waits) > 0 {
		sort.Float64s(waits)
		sum := 0.0
		for _, w := range waits {
			sum += w
		}
		res.MeanWait = sum / float64(len(waits))
		res.P95Wait = waits[len(waits)*95/100]
	}
	return res
}

// UpperBound is the utilisation no policy can beat: the GPU-time that jobs which fit some
// domain (an 8-GPU job fits only an 8-GPU domain) can possibly spend inside the measured
// window (a job runs at most its duration, and not before it arrives), capped by capacity. It
// ignores fragmentation and queueing entirely, so it is loose at high load, but it is a bound.
func UpperBound(nodes []*Node, jobs []Job, horizon, warmup float64) float64 {
	largest := 0
	for _, n := range nodes {
		for _, d := range n.Domains {
			largest = max(largest, len(d))
		}
	}
	demand := 0.0
	for _, j := range jobs {
		if j.Size > largest {
			continue
		}
		demand += float64(j.Size) * math.Min(j.Duration, horizon-math.Max(j.Arrival, warmup))
	}
	return math.Min(1, demand/(float64(8*len(nodes))*(horizon-warmup)))
}

// Nvdomain pins each job to a domain id on arrival (the webhook's choice, production code)
// and places it like the stock scheduler: any node whose pinned domain has room, chosen at
// random (the default scheduler does not score extended resources), GPUs chosen inside the
// domain by the NRI plugin's aligned blocks (production code).
type Nvdomain struct{ pinned map[int]int }

func (p *Nvdomain) Name() string { return "nvdomain" }

// FitKey implements Policy: size and pinned domain.
func (p *Nvdomain) FitKey(j *Job) int { return j.Size*1000 + p.pinned[j.ID] }

func (p *Nvdomain) Admit(j *Job, nodes []*Node) bool {
	if p.pinned == nil {
		p.pinned = map[int]int{}
	}
	ch := placement.NewDomainChooser(j.Size)
	for i, n := range nodes {
		for d, gs := range n.Domains {
			ch.Consider(placement.Candidate{Node: fmt.Sprint(i), Domain: d, Capacity: len(gs), Free: n.domainFree(d)})
		}
	}
	dec, err := ch.Decide()
	if err != nil {
		return false
	}
	p.pinned[j.ID] = dec.Domain
	return true
}

func (p *Nvdomain) Place(j *Job, nodes []*Node, rng *rand.Rand) (int, []int, bool) {
	d := p.pinned[j.ID]
	var feasible []int
	for i, n := range nodes {
		if d < len(n.Domains) && len(n.Domains[d]) >= j.Size && n.domainFree(d) >= j.Size {
			feasible = append(feasible, i)
		}
	}
	if len(feasible) == 0 {
		return 0, nil, false
	}
	ni := feasible[rng.IntN(len(feasible))]
	n := nodes[ni]
	gs, err := placement.ChooseGPUs(j.Size, n.Domains[d], func(g int) bool { return n.used[g] })
	if err != nil {
		return 0, nil, false
	}
	return ni, gs, true
}

// NodeCountOnly is today's default stack: the scheduler sees only nvidia.com/gpu counts and
// picks any node with enough free GPUs; on the node the device plugin's best-effort policy
// (go-gpuallocator) prefers GPUs joined by links it can see. It sees direct NVLink bridges,
// but not links that end at an NVSwitch, so on switch-based nodes every GPU looks alike and it
// takes the lowest free indexes.
type NodeCountOnly struct{}

func (NodeCountOnly) FitKey(j *Job) int { return j.Size }

func (NodeCountOnly) Name() string             { return "node-count only" }
func (NodeCountOnly) Admit(*Job, []*Node) bool { return true }

// byCount lists the nodes with at least k free GPUs.
func byCount(nodes []*Node, k int) []int {
	var feasible []int
	for i, n := range nodes {
		if n.free() >= k {
			feasible = append(feasible, i)
		}
	}
	return feasible
}

func (NodeCountOnly) Place(j *Job, nodes []*Node, rng *rand.Rand) (int, []int, bool) {
	feasible := byCount(nodes, j.Size)
	if len(feasible) == 0 {
		return 0, nil, false
	}
	ni := feasible[rng.IntN(len(feasible))]
	n := nodes[ni]
	if n.Kind == Bridged4x2 {
		return ni, pairsFirst(n, j.Size), true
	}
	return ni, lowestFree(n, j.Size), true
}

func lowestFree(n *Node, k int) []int {
	var out []int
	for g := 0; g < 8 && len(out) < k; g++ {
		if !n.used[g] {
			out = append(out, g)
		}
	}
	return out
}

// pairsFirst takes whole free bridged pairs, then single GPUs.
func pairsFirst(n *Node, k int) []int {
	var out []int
	for _, d := range n.Domains {
		if len(out)+2 <= k && !n.used[d[0]] && !n.used[d[1]] {
			out = append(out, d...)
		}
	}
	for g := 0; g < 8 && len(out) < k; g++ {
		if !n.used[g] && !slices.Contains(out, g) {
			out = append(out, g)
		}
	}
	sort.Ints(out)
	return out
}

// Random places on a random node with enough GPUs, random GPUs.
type Random struct{}

func (Random) FitKey(j *Job) int { return j.Size }

func (Random) Name() string             { return "random" }
func (Random) Admit(*Job, []*Node) bool { return true }

func (Random) Place(j *Job, nodes []*Node, rng *rand.Rand) (int, []int, bool) {
	feasible := byCount(nodes, j.Size)
	if len(feasible) == 0 {
		return 0, nil, false
	}
	ni := feasible[rng.IntN(len(feasible))]
	var free []int
	for g := range 8 {
		if !nodes[ni].used[g] {
			free = append(free, g)
		}
	}
	rng.Shuffle(len(free), func(a, b int) { free[a], free[b] = free[b], free[a] })
	out := free[:j.Size]
	sort.Ints(out)
	return ni, out, true
}

// FirstFit places on the first node with enough GPUs, lowest free GPUs.
type FirstFit struct{}

func (FirstFit) FitKey(j *Job) int { return j.Size }

func (FirstFit) Name() string             { return "first-fit" }
func (FirstFit) Admit(*Job, []*Node) bool { return true }

func (FirstFit) Place(j *Job, nodes []*Node, _ *rand.Rand) (int, []int, bool) {
	for i, n := range nodes {
		if n.free() >= j.Size {
			return i, lowestFree(n, j.Size), true
		}
	}
	return 0, nil, false
}

// Package placementsim replays a seeded job trace on a simulated GPU cluster under several
// placement policies and measures what each buys: how many tensor-parallel jobs get GPUs that
// span NVLink domains, GPU utilisation, queueing delay and jobs never placed. nvdomain's
// policy runs the production code (pkg/placement); the others model today's alternatives.
package placementsim

import (
	"container/heap"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"sort"

	decision "github.com/nvdomain/nvdomain/pkg/admission"
	"github.com/nvdomain/nvdomain/pkg/dra"
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

// Node is one simulated machine of 8 GPUs.
type Node struct {
	Kind    NodeKind
	Domains [][]int // GPU indexes per domain
	// name sorts like the node's index, so the production chooser's tie-break on node names
	// (pkg/placement) orders nodes the way a reader of the trace would.
	name string
	used [8]bool
	// published is what the DRA driver publishes for the node (DRAShipped), built on first use.
	published []dra.Slot
}

func newNode(k NodeKind, index int) *Node {
	n := &Node{Kind: k, name: fmt.Sprintf("n%04d", index)}
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

func (n *Node) inUse(g int) bool { return n.used[g] }

func (n *Node) free() int {
	c := 0
	for _, u := range n.used {
		if !u {
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

// largestDomain is the most GPUs any domain of any node has.
func largestDomain(nodes []*Node) int {
	largest := 0
	for _, n := range nodes {
		for _, d := range n.Domains {
			largest = max(largest, len(d))
		}
	}
	return largest
}

// Cluster builds hgx HGX nodes, then split, then bridged ones (the mixed 64-node cluster is
// Cluster(32, 16, 16)).
func Cluster(hgx, split, bridged int) []*Node {
	var out []*Node
	for _, c := range []struct {
		kind  NodeKind
		count int
	}{{HGX8, hgx}, {Split2x4, split}, {Bridged4x2, bridged}} {
		for range c.count {
			out = append(out, newNode(c.kind, len(out)))
		}
	}
	return out
}

// Job is one request in the trace: a batch job that runs for Duration, or one instance of a
// long-lived service that runs until the service is next rolled.
type Job struct {
	ID       int
	Size     int
	Arrival  float64
	Duration float64
	// Priority orders the scheduling queue before arrival, as pod priority does.
	Priority int
	// Service marks a long-lived service instance. It runs until the first of Rolls after it
	// starts (or past the horizon when there is none); at that roll the instance ends and a
	// replacement of the same size arrives at once, as a rolling update with maxSurge 0 does.
	// A roll that comes while the instance still waits is absorbed: the rollout waits for it.
	Service bool
	Rolls   []float64 // ascending; shared by every instance of one service
}

// SizeShare is the share of jobs asking for Size GPUs.
type SizeShare struct {
	Size  int
	Share float64
}

// SizeMix is the share of jobs of each GPU count: mostly small inference replicas, some TP=4
// and TP=8 (70B-class models).
var SizeMix = []SizeShare{{1, 0.40}, {2, 0.30}, {4, 0.20}, {8, 0.10}}

func meanSize(mix []SizeShare) float64 {
	m := 0.0
	for _, s := range mix {
		m += float64(s.Size) * s.Share
	}
	return m
}

// Trace draws Poisson arrivals of SizeMix jobs whose offered load is load × gpus, with
// exponential durations of mean meanDuration, over horizon.
func Trace(seed uint64, gpus int, load, meanDuration, horizon float64) []Job {
	return batchTrace(seed, gpus, load, meanDuration, horizon, SizeMix)
}

func batchTrace(seed uint64, gpus int, load, meanDuration, horizon float64, mix []SizeShare) []Job {
	var jobs []Job
	if load <= 0 {
		return jobs
	}
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	rate := load * float64(gpus) / (meanSize(mix) * meanDuration)
	t := 0.0
	for id := 0; ; id++ {
		t += rng.ExpFloat64() / rate
		if t > horizon {
			return jobs
		}
		u, size := rng.Float64(), mix[len(mix)-1].Size
		for _, s := range mix {
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

// Controller is a policy that also runs a controller beside the scheduler. Run calls Act
// after every scheduling pass, and again at once whenever Act moved a waiter, so that the
// scheduler places the moved waiter before the controller looks at the next one.
type Controller interface {
	// Act may re-pin one waiter of queue (scheduling order) and returns it, or nil. wake is
	// the next time Act wants to run though no job arrives or ends (+Inf for never): a
	// waiter's grace period running out, or the rate limit letting the next move through.
	Act(now float64, queue []*Job, nodes []*Node) (moved *Job, wake float64)
}

// Result is one policy at one load.
type Result struct {
	Scenario       string // set by the caller
	Policy         string
	Load           float64
	Jobs           int // arrivals, service replacements included
	TPJobs         int
	CrossDomainPct float64 // of placed jobs of size ≥ 2
	Utilisation    float64 // busy GPU-time / (GPUs × horizon)
	MeanWait       float64 // over jobs arriving after warmup that were placed
	P95Wait        float64
	// MeanWaitBySize is MeanWait by GPU count (index), 0 where no such job was measured.
	MeanWaitBySize [9]float64
	// TPMeanWait is MeanWait over jobs of size ≥ 2 only.
	TPMeanWait float64
	// StrandedPct is the share of TP jobs arriving after warmup that could not start on
	// arrival although the cluster had at least their size in free GPUs, because no domain had
	// that many: jobs kept waiting by how free GPUs are scattered (across domains or nodes),
	// not by a lack of GPUs. It is judged on arrival, when every policy tries the job at once,
	// so a long wait does not count more than a short one.
	StrandedPct float64
	NeverPlaced int // rejected at admission or still waiting at the end
	Rejected    int
	Repins      int // waiters a Controller moved
	// Lapses counts waiters the re-pin controller found stranded that lost the room to
	// another job before their grace period ran out.
	Lapses int
}

type event struct {
	t    float64
	node int
	gpus []int
	job  *Job
}

type eventHeap []event

func (h eventHeap) Len() int           { return len(h) }
func (h eventHeap) Less(i, j int) bool { return h[i].t < h[j].t }
func (h eventHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)        { *h = append(*h, x.(event)) }
func (h *eventHeap) Pop() any          { o := *h; e := o[len(o)-1]; *h = o[:len(o)-1]; return e }

// placed records where and when a job started, for tests that follow single jobs.
type placed struct {
	start float64
	node  int
	gpus  []int
}

// Run replays jobs under a policy. Waiting jobs are retried in scheduling order (priority,
// then arrival) whenever GPUs free up, like the scheduler's queue; any job that fits starts
// (backfill). Utilisation is measured over the whole run, [0, horizon], the window UpperBound
// uses; waits only on jobs arriving after warmup, once queues have formed.
func Run(p Policy, mkNodes func() []*Node, jobs []Job, horizon, warmup float64, seed uint64) Result {
	return run(p, mkNodes(), jobs, horizon, warmup, seed, nil)
}

type sim struct {
	p               Policy
	ctl             Controller // nil when p has none
	nodes           []*Node
	rng             *rand.Rand
	horizon, warmup float64
	ends            eventHeap
	queue           []*Job
	spawned         []*Job // replacements of rolled services, in arrival order
	nextID          int
	wake            float64
	res             Result
	waits           []float64
	bySize          [9]struct{ sum, n float64 }
	tpWait          struct{ sum, n float64 }
	tpMeasured      int          // TP jobs arriving after warmup
	stranded        map[int]bool // IDs of TP jobs after warmup stranded by fragmentation on arrival
	busy            float64
	cross, tpPlaced int
	log             map[int]placed // nil unless a test follows jobs
}

func run(p Policy, nodes []*Node, jobs []Job, horizon, warmup float64, seed uint64, log map[int]placed) Result {
	s := &sim{p: p, nodes: nodes, rng: rand.New(rand.NewPCG(seed, 7)), horizon: horizon, warmup: warmup,
		wake: math.Inf(1), res: Result{Policy: p.Name()}, log: log, stranded: map[int]bool{}}
	s.ctl, _ = p.(Controller)
	for _, j := range jobs {
		s.nextID = max(s.nextID, j.ID+1)
	}
	next := 0
	for {
		tEnd, tArr, tSpawn := math.Inf(1), math.Inf(1), math.Inf(1)
		if len(s.ends) > 0 {
			tEnd = s.ends[0].t
		}
		if next < len(jobs) {
			tArr = jobs[next].Arrival
		}
		if len(s.spawned) > 0 {
			tSpawn = s.spawned[0].Arrival
		}
		// GPUs freed at an instant are offered to the queue before that instant's arrivals.
		t := min(tEnd, tArr, tSpawn, s.wake)
		if t > horizon || math.IsInf(t, 1) {
			break
		}
		switch t {
		case tEnd:
			s.release(heap.Pop(&s.ends).(event))
			s.settle(t)
		case tArr:
			s.arrive(&jobs[next])
			next++
		case tSpawn:
			j := s.spawned[0]
			s.spawned = s.spawned[1:]
			s.arrive(j)
		default:
			s.wake = math.Inf(1)
			s.settle(t)
		}
	}
	return s.finish()
}

func (s *sim) arrive(j *Job) {
	s.res.Jobs++
	if j.Size >= 2 {
		s.res.TPJobs++
		if j.Arrival >= s.warmup {
			s.tpMeasured++
		}
	}
	if !s.p.Admit(j, s.nodes) {
		s.res.Rejected++
		return
	}
	// Keep the queue in scheduling order: the first job it must come before.
	i := sort.Search(len(s.queue), func(i int) bool { return before(j, s.queue[i]) })
	s.queue = slices.Insert(s.queue, i, j)
	s.settle(j.Arrival)
}

// before is the scheduler's queue order: higher priority, then earlier arrival.
func before(a, b *Job) bool {
	if a.Priority != b.Priority {
		return a.Priority > b.Priority
	}
	if a.Arrival != b.Arrival {
		return a.Arrival < b.Arrival
	}
	return a.ID < b.ID
}

func (s *sim) release(e event) {
	for _, g := range e.gpus {
		s.nodes[e.node].used[g] = false
	}
	if e.job.Service {
		r := *e.job
		r.ID, r.Arrival = s.nextID, e.t
		s.nextID++
		s.spawned = append(s.spawned, &r)
	}
}

// settle runs a scheduling pass, then lets the controller move waiters one at a time, each
// followed by a pass, so the scheduler has placed a moved waiter before the next is judged.
func (s *sim) settle(now float64) {
	s.tryQueue(now)
	if s.ctl == nil {
		return
	}
	for {
		moved, wake := s.ctl.Act(now, s.queue, s.nodes)
		if moved == nil {
			s.wake = wake
			return
		}
		s.res.Repins++
		s.tryQueue(now)
	}
}

func (s *sim) tryQueue(now float64) {
	kept := s.queue[:0]
	// Placing a job only takes GPUs away, so a group that failed once in a pass fails for the
	// rest of it; without this, long queues at overload make the run quadratic.
	failed := map[int]bool{}
	for _, j := range s.queue {
		key := s.p.FitKey(j)
		if failed[key] {
			kept = append(kept, j)
			continue
		}
		ni, gs, ok := s.p.Place(j, s.nodes, s.rng)
		if !ok {
			failed[key] = true
			kept = append(kept, j)
			continue
		}
		s.start(j, now, ni, gs)
	}
	clear(s.queue[len(kept):])
	s.queue = kept
	s.markStranded(now)
}

// markStranded records the TP jobs that arrived now and wait although the cluster has as many
// free GPUs as they need: no domain has that many.
func (s *sim) markStranded(now float64) {
	total, roomiest := freeAndRoomiest(s.nodes)
	for _, j := range s.queue {
		if j.Arrival == now && j.Size >= 2 && j.Arrival >= s.warmup && j.Size <= total && j.Size > roomiest {
			s.stranded[j.ID] = true
		}
	}
}

// freeAndRoomiest is the cluster's free GPUs and the most free GPUs of any one domain: a job
// of k GPUs with k ≤ total but k > roomiest is stranded by fragmentation.
func freeAndRoomiest(nodes []*Node) (total, roomiest int) {
	for _, n := range nodes {
		total += n.free()
		for d := range n.Domains {
			roomiest = max(roomiest, n.domainFree(d))
		}
	}
	return total, roomiest
}

func (s *sim) start(j *Job, now float64, ni int, gs []int) {
	n := s.nodes[ni]
	for _, g := range gs {
		n.used[g] = true
	}
	end := now + j.Duration
	if j.Service {
		end = math.Inf(1)
		if i, _ := slices.BinarySearch(j.Rolls, math.Nextafter(now, math.Inf(1))); i < len(j.Rolls) {
			end = j.Rolls[i]
		}
	}
	if !math.IsInf(end, 1) {
		heap.Push(&s.ends, event{end, ni, gs, j})
	}
	if hi := math.Min(end, s.horizon); hi > now {
		s.busy += (hi - now) * float64(j.Size)
	}
	if j.Arrival >= s.warmup {
		s.waits = append(s.waits, now-j.Arrival)
		if j.Size < len(s.bySize) {
			s.bySize[j.Size].sum += now - j.Arrival
			s.bySize[j.Size].n++
		}
		if j.Size >= 2 {
			s.tpWait.sum += now - j.Arrival
			s.tpWait.n++
		}
	}
	if s.log != nil {
		s.log[j.ID] = placed{now, ni, gs}
	}
	if j.Size >= 2 {
		s.tpPlaced++
		d := n.domainOf(gs[0])
		for _, g := range gs {
			if n.domainOf(g) != d || d < 0 {
				s.cross++
				break
			}
		}
	}
}

func (s *sim) finish() Result {
	res := s.res
	if l, ok := s.p.(interface{ lapses() int }); ok {
		res.Lapses = l.lapses()
	}
	res.NeverPlaced = res.Rejected + len(s.queue)
	if s.tpPlaced > 0 {
		res.CrossDomainPct = 100 * float64(s.cross) / float64(s.tpPlaced)
	}
	res.Utilisation = s.busy / (float64(8*len(s.nodes)) * s.horizon)
	if len(s.waits) > 0 {
		sort.Float64s(s.waits)
		sum := 0.0
		for _, w := range s.waits {
			sum += w
		}
		res.MeanWait = sum / float64(len(s.waits))
		res.P95Wait = s.waits[len(s.waits)*95/100]
	}
	if s.tpWait.n > 0 {
		res.TPMeanWait = s.tpWait.sum / s.tpWait.n
	}
	if s.tpMeasured > 0 {
		res.StrandedPct = 100 * float64(len(s.stranded)) / float64(s.tpMeasured)
	}
	for k, w := range s.bySize {
		if w.n > 0 {
			res.MeanWaitBySize[k] = w.sum / w.n
		}
	}
	return res
}

// UpperBound is the utilisation no policy can beat, over the window Run measures utilisation
// on, [0, horizon]: the offered load, capped by capacity. A job can hold its GPUs inside the
// window for at most min(duration, horizon − arrival), since it cannot start before it
// arrives, and a service's chain of instances for at most horizon − arrival; jobs that fit no
// domain are left out (domain-aware policies reject them). That is exactly the GPU-time every
// job gets when it starts on arrival, so utilisation equals the bound whenever nothing waits,
// and falls below it only by queueing and fragmentation. It ignores both, so it is loose
// at high load.
//
// An earlier version measured from the end of warmup but counted each job's whole duration,
// including jobs that had ended before warmup, which put the bound a warmup's worth of work
// (about 11% at 50% load, see docs/benchmarks.md) above what any policy could reach.
func UpperBound(nodes []*Node, jobs []Job, horizon float64) float64 {
	largest := largestDomain(nodes)
	offered := 0.0
	for _, j := range jobs {
		if j.Size > largest || j.Arrival >= horizon {
			continue
		}
		held := horizon - j.Arrival
		if !j.Service {
			held = math.Min(j.Duration, held)
		}
		offered += float64(j.Size) * held
	}
	return math.Min(1, offered/(float64(8*len(nodes))*horizon))
}

// Nvdomain pins each job to a domain id on arrival (the webhook's choice, production code,
// with the per-request seed production spreads ties and waiters with, and the line of jobs
// already waiting for each id) and places it like the stock scheduler: among the nodes whose
// pinned domain has room, those where the pod's preferred node affinity scores highest, at
// random among those, since the scheduler's other scores (cpu and memory balance; it does not
// score extended resources by default) do not depend on GPUs. The preferred terms are the
// webhook's own (webhook.Pin), judged by the scheduler's matcher: nodes where the pinned domain
// is small for the pod, and, for a job that fits when it is admitted, the nodes the decision
// names as the tightest fit (its hint). GPUs are chosen inside the domain by the NRI plugin's
// aligned blocks (production code).
type Nvdomain struct {
	// WhatIf measures changes production does not make; the zero value is production.
	WhatIf WhatIf

	pinned map[int]int
	// attempts counts a job's admissions: a re-pinned job's replacement is a new pod, whose
	// admission request hashes to a new seed.
	attempts map[int]int
	// line holds, per domain id, the GPUs of the jobs pinned to it and not started: what the
	// webhook's view finds waiting there (clusterview's applyPending).
	line map[int]int
	// pref holds what the webhook's decision told a job's pin (its hint, when admitted with
	// room, and the sizes its id has), until it starts.
	pref map[int]decision.Preference
	// seed overrides the admission seed in tests that need to know where a job is pinned
	// (a zero seed is the chooser's deterministic rule); nil is production's per-request hash.
	seed func(id, attempt int) uint64
	// force replaces, in tests, the id a job is pinned to when no id has room for it, by job
	// ID, so that a test of the re-pin controller can strand jobs where it wants them.
	force map[int]int
}

// WhatIf are changes to production that the benchmark measures against the gap between
// nvdomain + re-pin and "any domain with room"; none of them is what nvdomain does by default.
type WhatIf struct {
	// Pack has the scheduler take, among the nodes its affinity score ranks first, one whose
	// pinned domain has the fewest free GPUs, as the tightest fit does, instead of any, for
	// every pod and not only one admitted with a hint: what the optional scheduler profile of
	// docs/scheduler.md (NodeResourcesFit scoring the nvswitch-domain resources with
	// MostAllocated) comes close to.
	Pack bool
}

func (p *Nvdomain) Name() string { return "nvdomain" + p.WhatIf.suffix() }

// suffix names the changes in a policy's name, "" for production.
func (w WhatIf) suffix() string {
	if w.Pack {
		return " (what if: packing scheduler)"
	}
	return ""
}

// FitKey implements Policy: size and pinned domain.
func (p *Nvdomain) FitKey(j *Job) int { return j.Size*1000 + p.pinned[j.ID] }

func (p *Nvdomain) Admit(j *Job, nodes []*Node) bool {
	_, err := p.decide(j, nodes)
	return err == nil
}

// decide is the webhook's decision for the job's next admission, recorded: its pin, its place
// in the line of that id until it starts, and its hint when it fits now. A re-pinned job
// leaves the line it was in first, as the evicted pod leaves the webhook's view.
func (p *Nvdomain) decide(j *Job, nodes []*Node) (placement.Decision, error) {
	p.ready()
	if d, ok := p.pinned[j.ID]; ok {
		p.line[d] -= j.Size
	}
	attempt := p.attempts[j.ID]
	p.attempts[j.ID]++
	seed := admissionSeed(j.ID, attempt)
	if p.seed != nil {
		seed = p.seed(j.ID, attempt)
	}
	dec, err := chooseDomain(j.Size, nodes, seed, p.line)
	if err != nil {
		delete(p.pinned, j.ID)
		return dec, err
	}
	if d, ok := p.force[j.ID]; ok && !dec.Fits {
		dec.Domain = d
	}
	p.pinned[j.ID] = dec.Domain
	p.line[dec.Domain] += j.Size
	p.pref[j.ID] = decision.PreferenceOf(dec)
	return dec, nil
}

// admissionSeed stands in for the webhook's seed, an FNV-1a hash of the admission request's
// UID made nonzero: every admission of every job (a re-pin's replacement included) gets its
// own, so its tie-break and, among nearly equal lines, the id it waits for are drawn afresh.
func admissionSeed(id, attempt int) uint64 {
	h := fnv.New64a()
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], uint64(id))
	binary.LittleEndian.PutUint64(b[8:], uint64(attempt))
	_, _ = h.Write(b[:])
	return h.Sum64() | 1
}

// chooseDomain is the webhook's decision (production code) over the nodes' free GPUs now,
// every node named for the hint (a node's name is its hostname here), with ties and waiters
// spread by seed (0: the deterministic rule) and line, per domain id, the GPUs of the jobs
// pinned to it and waiting. The webhook's view counts those jobs as pods pinned but not bound
// and first lets them take any room their id has (clusterview's applyPending); here every
// waiter has already failed to fit its id (the scheduler tries the whole queue after every
// release, before any arrival), so that would take no room, and all their GPUs are the line.
func chooseDomain(k int, nodes []*Node, seed uint64, line map[int]int) (placement.Decision, error) {
	ch := placement.NewDomainChooser(k).Spread(seed)
	for _, n := range nodes {
		for d, gs := range n.Domains {
			ch.ConsiderNodes(placement.Candidate{Node: n.name, Domain: d, Capacity: len(gs), Free: n.domainFree(d)}, 1, n.name)
		}
	}
	for d, gpus := range line {
		ch.Queue(d, gpus)
	}
	dec, err := ch.Decide()
	if err != nil {
		return dec, fmt.Errorf("domain for %d GPUs: %w", k, err)
	}
	return dec, nil
}

// ready makes the policy's maps on first use, so a zero Nvdomain is production.
func (p *Nvdomain) ready() {
	if p.pinned == nil {
		p.pinned = map[int]int{}
	}
	if p.attempts == nil {
		p.attempts = map[int]int{}
	}
	if p.line == nil {
		p.line = map[int]int{}
	}
	if p.pref == nil {
		p.pref = map[int]decision.Preference{}
	}
}

func (p *Nvdomain) Place(j *Job, nodes []*Node, rng *rand.Rand) (int, []int, bool) {
	p.ready()
	d := p.pinned[j.ID]
	pref := p.pref[j.ID]
	var best []int
	var bestScore int64 = -1
	for i, n := range nodes {
		free := 0
		if d < len(n.Domains) {
			free = n.domainFree(d)
		}
		if free < j.Size {
			continue
		}
		a := affinityOf(j.Size, d, len(n.Domains[d]), slices.Contains(pref.Hint, n.name), pref)
		if !a.fits {
			continue
		}
		score := a.score
		if p.WhatIf.Pack {
			// Affinity first, then the fewest GPUs left free (at most 8 per domain).
			score = score*16 + int64(8-free)
		}
		switch {
		case score < bestScore:
			continue
		case score > bestScore:
			best, bestScore = best[:0], score
		}
		best = append(best, i)
	}
	if len(best) == 0 {
		return 0, nil, false
	}
	ni := best[rng.IntN(len(best))]
	n := nodes[ni]
	gs, err := placement.ChooseGPUs(j.Size, n.Domains[d], n.inUse)
	if err != nil {
		return 0, nil, false
	}
	p.line[d] -= j.Size
	delete(p.pref, j.ID)
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
	for g := 0; g < len(n.used) && len(out) < k; g++ {
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
	for g := 0; g < len(n.used) && len(out) < k; g++ {
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
	for g, u := range nodes[ni].used {
		if !u {
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

// Package topology is nvdomain's model of one node's GPUs and NVLink domains, and the one
// place where domains are computed from link information. The three discovery sources
// (topomatrix, nvmltopo, simulated) only gather GPUs and links; they all end in New or
// FromDomains here, so the same hardware always yields the same domains and ids: the webhook pins pods to an
// id, so every component and every restart must number domains alike.
package topology

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
)

// GPU is one device as the driver indexes it.
type GPU struct {
	// Index is the NVML / nvidia-smi index on the node.
	Index int `json:"index"`
	// UUID is the driver's GPU-… identifier; empty when the source does not know it.
	UUID string `json:"uuid,omitempty"`
	// PCIBusID is e.g. 00000000:18:00.0; empty when unknown.
	PCIBusID string `json:"pciBusID,omitempty"`
	// Product is the marketing name, e.g. "NVIDIA H100 80GB HBM3".
	Product string `json:"product,omitempty"`
	// MemoryMiB is the framebuffer size; 0 when unknown.
	MemoryMiB uint64 `json:"memoryMiB,omitempty"`
	// NUMANode is the CPU NUMA node closest to the GPU; nil when unknown or ambiguous.
	NUMANode *int `json:"numaNode,omitempty"`
	// CPUAffinity is the CPU list closest to the GPU, as nvidia-smi prints it ("0-47,96-143").
	CPUAffinity string `json:"cpuAffinity,omitempty"`
	// Fabric is the multi-node NVLink membership (GB200 NVL72 and later); nil when absent.
	Fabric *Fabric `json:"fabric,omitempty"`
	// Domain is the id of the domain holding this GPU; nil when it is in none.
	Domain *int `json:"domain,omitempty"`
	// Minor is the minor number of the GPU's device node /dev/nvidia<minor>, which the driver
	// assigns and which need not equal Index; nil when the source does not know it.
	Minor *int `json:"minor,omitempty"`
	// Unhealthy says why the GPU or its NVLink fabric is unusable (an XID or ECC error, a
	// Fabric Manager or NVSwitch fault; the simulated document's health field); empty when
	// healthy. The DRA driver taints the GPU's devices (docs/dra.md).
	Unhealthy string `json:"unhealthy,omitempty"`
	// XIDs are the critical XIDs the agent's watcher saw the GPU raise since the node booted,
	// and Lost says NVML lost the GPU (off the bus); both are also in Unhealthy's text. The
	// DRA driver names a device taint after each (names.DRATaintXID, names.DRATaintGPULost),
	// as NVIDIA's driver does, so a toleration or an alert can tell the faults apart.
	XIDs []uint64 `json:"xids,omitempty"`
	Lost bool     `json:"lost,omitempty"`
	// MIG is true when the GPU runs in MIG mode: its MIG devices are the device plugin's to
	// hand out, to other pods, so the GPU is in no domain and never packed as a whole GPU
	// (it is neither in Domains nor in Unlinked). Otherwise a plain 1-GPU container could be
	// re-selected onto the parent of another tenant's MIG instances (review node-side H4).
	MIG bool `json:"migEnabled,omitempty"`
}

// DeviceMinor is the GPU's device-node minor number: Minor when known, else Index, which is
// what it is on the machines where the source cannot tell.
func (g GPU) DeviceMinor() int {
	if g.Minor != nil {
		return *g.Minor
	}
	return g.Index
}

// Fabric is the NVLink fabric membership NVML reports for a GPU.
type Fabric struct {
	ClusterUUID string `json:"clusterUUID"`
	CliqueID    uint32 `json:"cliqueID"`
	// CliqueNodes and CliqueGPUs are the clique's size across nodes, where the source knows
	// it (a simulated rack); NVML reports only membership, and 0 means unknown: the webhook
	// then counts the clique's nodes itself.
	CliqueNodes int `json:"cliqueNodes,omitempty"`
	CliqueGPUs  int `json:"cliqueGPUs,omitempty"`
}

// Label is the clique as NVIDIA GPU Feature Discovery labels a node with it
// (nvidia.com/gpu.clique): <cluster UUID>.<clique id>.
func (f Fabric) Label() string { return fmt.Sprintf("%s.%d", f.ClusterUUID, f.CliqueID) }

// Clique is the multi-node NVLink clique the node's GPUs are in: ok is false when no GPU
// reports one, and err says which GPUs disagree when they report several (a partition Fabric
// Manager is still changing, or a misconfigured simulated rack), in which case the node is
// in no clique until they agree.
func (t *Topology) Clique() (f Fabric, ok bool, err error) {
	for _, g := range t.GPUs {
		if g.Fabric == nil {
			continue
		}
		if !ok {
			f, ok = *g.Fabric, true
			continue
		}
		if g.Fabric.Label() != f.Label() {
			return Fabric{}, false, fmt.Errorf("GPUs of this node report different NVLink cliques (%s and %s, GPU %d): the node joins no clique until Fabric Manager reports one for every GPU",
				f.Label(), g.Fabric.Label(), g.Index)
		}
	}
	return f, ok, nil
}

// Domain is a set of GPUs in which every pair talks over NVLink, directly or through NVSwitch.
type Domain struct {
	ID   int   `json:"id"`
	GPUs []int `json:"gpus"`
}

// Size is the number of GPUs in the domain.
func (d Domain) Size() int { return len(d.GPUs) }

// Topology is one node's GPUs and domains. Build it with New or FromDomains, which enforce
// the invariants every consumer relies on: GPUs sorted by index with unique indexes, domains
// disjoint with ids 0..D-1 in order of their lowest GPU, every GPU either in exactly one
// domain or listed in Unlinked.
type Topology struct {
	Source   string
	GPUs     []GPU
	Domains  []Domain
	Unlinked []int
	// Warnings say what the source could not tell (a truncated matrix, an NVLink whose far
	// end NVML could not name). A topology with warnings is still internally consistent.
	Warnings []string
}

// Links says which pairs of GPUs talk over NVLink. Sources fill it; New partitions it.
type Links struct {
	adj map[int]map[int]bool
}

// NewLinks returns an empty link set.
func NewLinks() *Links { return &Links{adj: map[int]map[int]bool{}} }

// Add records that GPUs a and b are linked. Self-links are ignored.
func (l *Links) Add(a, b int) {
	if a == b {
		return
	}
	for _, p := range [][2]int{{a, b}, {b, a}} {
		m := l.adj[p[0]]
		if m == nil {
			m = map[int]bool{}
			l.adj[p[0]] = m
		}
		m[p[1]] = true
	}
}

// Linked reports whether a and b are linked.
func (l *Links) Linked(a, b int) bool { return l.adj[a][b] }

// New builds a topology from GPUs and the links between them. Domains are the partition of the
// GPUs into cliques of the link graph, chosen largest first (see partition); a GPU left alone
// is Unlinked, not a domain of one.
func New(source string, gpus []GPU, links *Links, warnings []string) (*Topology, error) {
	sorted, err := sortGPUs(gpus)
	if err != nil {
		return nil, err
	}
	if links == nil {
		links = NewLinks()
	}
	idx := make([]int, 0, len(sorted))
	for _, g := range sorted {
		if !g.MIG { // a GPU in MIG mode joins no domain, whatever its links
			idx = append(idx, g.Index)
		}
	}
	groups := partition(idx, links)
	return assemble(source, sorted, groups, warnings), nil
}

// FromDomains builds a topology from declared domains (the simulated source). Each inner slice
// is one domain's GPU indexes. Errors name the offending domain by its position in domains.
func FromDomains(source string, gpus []GPU, domains [][]int, warnings []string) (*Topology, error) {
	sorted, err := sortGPUs(gpus)
	if err != nil {
		return nil, err
	}
	known, mig := map[int]bool{}, map[int]bool{}
	for _, g := range sorted {
		known[g.Index] = true
		mig[g.Index] = g.MIG
	}
	owner := map[int]int{}
	groups := make([][]int, 0, len(domains))
	for di, d := range domains {
		if len(d) < 2 {
			return nil, &DomainError{Domain: di, GPU: -1, Msg: "a domain needs at least 2 GPUs; leave a lone GPU out of every domain"}
		}
		for gi, g := range d {
			if !known[g] {
				return nil, &DomainError{Domain: di, GPU: gi, Msg: fmt.Sprintf("GPU %d is not declared", g)}
			}
			if mig[g] {
				return nil, &DomainError{Domain: di, GPU: gi, Msg: fmt.Sprintf("GPU %d is in MIG mode, so it cannot be part of a domain; leave it out of every domain", g)}
			}
			if prev, dup := owner[g]; dup {
				if prev == di {
					return nil, &DomainError{Domain: di, GPU: gi, Msg: fmt.Sprintf("GPU %d is listed twice", g)}
				}
				return nil, &DomainError{Domain: di, GPU: gi, Msg: fmt.Sprintf("GPU %d is already in domains[%d]; a GPU belongs to at most one domain", g, prev)}
			}
			owner[g] = di
		}
		groups = append(groups, slices.Sorted(slices.Values(d)))
	}
	return assemble(source, sorted, groups, warnings), nil
}

// DomainError locates a problem in FromDomains' input: Domain is the position in the domains
// argument, GPU the position inside it (-1 for the domain as a whole).
type DomainError struct {
	Domain int
	GPU    int
	Msg    string
}

// Path is where the problem is, e.g. domains[1].gpus[2].
func (e *DomainError) Path() string {
	if e.GPU < 0 {
		return fmt.Sprintf("domains[%d]", e.Domain)
	}
	return fmt.Sprintf("domains[%d].gpus[%d]", e.Domain, e.GPU)
}

func (e *DomainError) Error() string { return e.Path() + ": " + e.Msg }

func sortGPUs(gpus []GPU) ([]GPU, error) {
	sorted := slices.Clone(gpus)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Index < sorted[j].Index })
	for i, g := range sorted {
		if g.Index < 0 {
			return nil, fmt.Errorf("GPU index %d is negative", g.Index)
		}
		if i > 0 && sorted[i-1].Index == g.Index {
			return nil, fmt.Errorf("GPU index %d is declared twice", g.Index)
		}
		sorted[i].Domain = nil
	}
	return sorted, nil
}

// assemble numbers the groups by their lowest GPU (deterministic ids: see the package comment) and fills the
// back-references. groups must be disjoint, sorted inside, over known GPUs.
func assemble(source string, gpus []GPU, groups [][]int, warnings []string) *Topology {
	slices.SortFunc(groups, func(a, b []int) int { return a[0] - b[0] })
	t := &Topology{Source: source, GPUs: gpus, Warnings: slices.Clone(warnings)}
	pos := map[int]int{}
	for i, g := range gpus {
		pos[g.Index] = i
	}
	for id, grp := range groups {
		t.Domains = append(t.Domains, Domain{ID: id, GPUs: grp})
		for _, g := range grp {
			d := id
			t.GPUs[pos[g]].Domain = &d
		}
	}
	for _, g := range t.GPUs {
		if g.Domain == nil && !g.MIG {
			t.Unlinked = append(t.Unlinked, g.Index)
		}
	}
	return t
}

// GPU returns the GPU with the given index.
func (t *Topology) GPU(index int) (GPU, bool) {
	i, ok := slices.BinarySearchFunc(t.GPUs, index, func(g GPU, idx int) int { return g.Index - idx })
	if !ok {
		return GPU{}, false
	}
	return t.GPUs[i], true
}

// Domain returns the domain with the given id.
func (t *Topology) Domain(id int) (Domain, bool) {
	if id < 0 || id >= len(t.Domains) {
		return Domain{}, false
	}
	return t.Domains[id], true
}

// MaxDomainSize is the size of the largest domain, 0 when there is none.
func (t *Topology) MaxDomainSize() int {
	m := 0
	for _, d := range t.Domains {
		m = max(m, d.Size())
	}
	return m
}

// wire is the JSON form. "gpus" is the count and "devices" the details, so that the summary an
// operator greps for ({"gpus": 8, "domains": [...], "unlinked": [...]}) is the same document
// the agent publishes in the topology annotation.
type wire struct {
	Source   string   `json:"source,omitempty"`
	GPUs     int      `json:"gpus"`
	Domains  []Domain `json:"domains"`
	Unlinked []int    `json:"unlinked"`
	Devices  []GPU    `json:"devices"`
	Warnings []string `json:"warnings,omitempty"`
}

// Fingerprint identifies what placement depends on: the domains, and which GPU (UUID and
// device minor) each index is. The agent and the NRI plugin compare fingerprints to notice
// that they read different topologies, where a domain id in a pod's annotation would mean
// other GPUs to the plugin than to the scheduler.
func (t *Topology) Fingerprint() string {
	h := sha256.New()
	for _, g := range t.GPUs {
		fmt.Fprintf(h, "gpu %d %s %d\n", g.Index, g.UUID, g.DeviceMinor())
		if g.MIG { // only then, so that fingerprints of nodes without MIG stay what they were
			fmt.Fprintf(h, "mig %d\n", g.Index)
		}
	}
	for _, d := range t.Domains {
		fmt.Fprintf(h, "domain %d %v\n", d.ID, d.GPUs)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// MarshalJSON writes the documented shape; empty lists are [] rather than null.
func (t *Topology) MarshalJSON() ([]byte, error) {
	w := wire{
		Source:   t.Source,
		GPUs:     len(t.GPUs),
		Domains:  t.Domains,
		Unlinked: t.Unlinked,
		Devices:  t.GPUs,
		Warnings: t.Warnings,
	}
	if w.Domains == nil {
		w.Domains = []Domain{}
	}
	if w.Unlinked == nil {
		w.Unlinked = []int{}
	}
	if w.Devices == nil {
		w.Devices = []GPU{}
	}
	return json.Marshal(w)
}

// UnmarshalJSON reads what MarshalJSON writes and rebuilds the topology through FromDomains,
// so a hand-edited or corrupted annotation can never yield an inconsistent model: the
// domains listed must match the devices' own domain fields and the ids must be canonical.
func (t *Topology) UnmarshalJSON(data []byte) error {
	var w wire
	if err := json.Unmarshal(data, &w); err != nil {
		return err
	}
	if w.GPUs != len(w.Devices) {
		return fmt.Errorf("topology: gpus is %d but %d devices are listed", w.GPUs, len(w.Devices))
	}
	groups := make([][]int, len(w.Domains))
	for i, d := range w.Domains {
		groups[i] = d.GPUs
	}
	rebuilt, err := FromDomains(w.Source, w.Devices, groups, w.Warnings)
	if err != nil {
		return fmt.Errorf("topology: %w", err)
	}
	for i, d := range w.Domains {
		if rebuilt.Domains[i].ID != d.ID || !slices.Equal(rebuilt.Domains[i].GPUs, sortedCopy(d.GPUs)) {
			return fmt.Errorf("topology: domains[%d] has id %d but domains are numbered by their lowest GPU; expected id %d for GPUs %v",
				i, d.ID, rebuilt.Domains[i].ID, rebuilt.Domains[i].GPUs)
		}
	}
	for _, g := range w.Devices {
		got, _ := rebuilt.GPU(g.Index)
		if (g.Domain == nil) != (got.Domain == nil) || (g.Domain != nil && *g.Domain != *got.Domain) {
			return fmt.Errorf("topology: device %d names domain %s but the domains list says %s", g.Index, fmtDomain(g.Domain), fmtDomain(got.Domain))
		}
	}
	*t = *rebuilt
	return nil
}

func sortedCopy(s []int) []int { return slices.Sorted(slices.Values(s)) }

func fmtDomain(d *int) string {
	if d == nil {
		return "none"
	}
	return fmt.Sprint(*d)
}

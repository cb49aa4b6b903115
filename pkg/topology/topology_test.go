package topology

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
)

func gpusN(n int) []GPU {
	out := make([]GPU, n)
	for i := range out {
		out[i] = GPU{Index: i}
	}
	return out
}

func linksOf(pairs ...[2]int) *Links {
	l := NewLinks()
	for _, p := range pairs {
		l.Add(p[0], p[1])
	}
	return l
}

func clique(gpus ...int) [][2]int {
	var out [][2]int
	for i := range gpus {
		for j := i + 1; j < len(gpus); j++ {
			out = append(out, [2]int{gpus[i], gpus[j]})
		}
	}
	return out
}

func TestNewPartitionsIntoDomains(t *testing.T) {
	cubeMesh := append(clique(0, 1, 2, 3), clique(4, 5, 6, 7)...)
	cubeMesh = append(cubeMesh, [2]int{0, 4}, [2]int{1, 5}, [2]int{2, 6}, [2]int{3, 7})
	cases := []struct {
		name     string
		n        int
		links    [][2]int
		domains  [][]int
		unlinked []int
	}{
		{"nvswitch 8", 8, clique(0, 1, 2, 3, 4, 5, 6, 7), [][]int{{0, 1, 2, 3, 4, 5, 6, 7}}, nil},
		{"hybrid cube-mesh splits 0-3 and 4-7", 8, cubeMesh, [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, nil},
		{"bridged pairs 0-2 and 1-3", 4, [][2]int{{0, 2}, {1, 3}}, [][]int{{0, 2}, {1, 3}}, nil},
		{"pcie only", 4, nil, nil, []int{0, 1, 2, 3}},
		{"largest clique wins over lowest index", 4, [][2]int{{0, 1}, {0, 2}, {0, 3}, {2, 3}}, [][]int{{0, 2, 3}}, []int{1}},
		{"a lone GPU is no domain", 3, [][2]int{{0, 1}}, [][]int{{0, 1}}, []int{2}},
		{"ids follow the lowest GPU", 6, append(clique(1, 4, 5), [2]int{0, 3}), [][]int{{0, 3}, {1, 4, 5}}, []int{2}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			top, err := New("test", gpusN(tc.n), linksOf(tc.links...), nil)
			if err != nil {
				t.Fatal(err)
			}
			var got [][]int
			for i, d := range top.Domains {
				if d.ID != i {
					t.Errorf("domain %d has id %d", i, d.ID)
				}
				got = append(got, d.GPUs)
				for _, g := range d.GPUs {
					if gg, _ := top.GPU(g); gg.Domain == nil || *gg.Domain != d.ID {
						t.Errorf("GPU %d does not point back at domain %d", g, d.ID)
					}
				}
			}
			if !slices.EqualFunc(got, tc.domains, slices.Equal[[]int]) {
				t.Errorf("domains = %v, want %v", got, tc.domains)
			}
			if !slices.Equal(top.Unlinked, tc.unlinked) {
				t.Errorf("unlinked = %v, want %v", top.Unlinked, tc.unlinked)
			}
		})
	}
}

func TestNewIsDeterministicWhateverTheInputOrder(t *testing.T) {
	gpus := gpusN(8)
	slices.Reverse(gpus)
	a, _ := New("t", gpus, linksOf(append(clique(4, 5, 6, 7), clique(0, 1, 2, 3)...)...), nil)
	b, _ := New("t", gpusN(8), linksOf(append(clique(0, 1, 2, 3), clique(4, 5, 6, 7)...)...), nil)
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	if string(ja) != string(jb) {
		t.Errorf("same hardware, different topology:\n%s\n%s", ja, jb)
	}
}

func TestNewRejectsBadGPUs(t *testing.T) {
	for _, tc := range []struct {
		gpus []GPU
		want string
	}{
		{[]GPU{{Index: 0}, {Index: 0}}, "GPU index 0 is declared twice"},
		{[]GPU{{Index: -1}}, "GPU index -1 is negative"},
	} {
		if _, err := New("t", tc.gpus, nil, nil); err == nil || err.Error() != tc.want {
			t.Errorf("error = %v, want %q", err, tc.want)
		}
	}
}

func TestFromDomainsErrorsNameThePosition(t *testing.T) {
	cases := []struct {
		domains [][]int
		want    string
	}{
		{[][]int{{0, 1}, {2, 9}}, "domains[1].gpus[1]: GPU 9 is not declared"},
		{[][]int{{0, 1, 2}, {2, 3}}, "domains[1].gpus[0]: GPU 2 is already in domains[0]; a GPU belongs to at most one domain"},
		{[][]int{{0, 1, 1}}, "domains[0].gpus[2]: GPU 1 is listed twice"},
		{[][]int{{0}}, "domains[0]: a domain needs at least 2 GPUs; leave a lone GPU out of every domain"},
		{[][]int{{0, 1}, {2, 3}}, "domains[1].gpus[1]: GPU 3 is in MIG mode, so it cannot be part of a domain; leave it out of every domain"},
	}
	for _, tc := range cases {
		gpus := gpusN(4)
		gpus[3].MIG = true
		_, err := FromDomains("simulated", gpus, tc.domains, nil)
		if err == nil || err.Error() != tc.want {
			t.Errorf("FromDomains(%v) error = %v, want %q", tc.domains, err, tc.want)
		}
	}
}

func TestJSONRoundTrip(t *testing.T) {
	numa := 1
	gpus := gpusN(8)
	gpus[5] = GPU{Index: 5, UUID: "GPU-5", PCIBusID: "00000000:9A:00.0", Product: "NVIDIA H100 80GB HBM3", MemoryMiB: 81559, NUMANode: &numa,
		Fabric: &Fabric{ClusterUUID: "c1", CliqueID: 7}}
	top, err := FromDomains("simulated", gpus, [][]int{{4, 5, 6, 7}, {0, 1, 2, 3}}, []string{"w"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(top)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(b), `{"source":"simulated","gpus":8,"domains":[{"id":0,"gpus":[0,1,2,3]},{"id":1,"gpus":[4,5,6,7]}],"unlinked":[]`) {
		t.Errorf("unexpected JSON shape: %s", b)
	}
	var back Topology
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	b2, _ := json.Marshal(&back)
	if string(b) != string(b2) {
		t.Errorf("round trip changed the topology:\n%s\n%s", b, b2)
	}
}

// A GPU in MIG mode is in no domain and not unlinked, whatever its links, and says so in
// JSON; a node without MIG keeps the fingerprint it had before the field existed.
func TestMIGGPUsAreInNoDomainAndNeverUnlinked(t *testing.T) {
	links := NewLinks()
	for a := range 4 {
		for b := range 4 {
			links.Add(a, b)
		}
	}
	gpus := gpusN(6)
	plain, err := New("nvml", gpus, links, nil)
	if err != nil {
		t.Fatal(err)
	}
	gpus[3].MIG, gpus[5].MIG = true, true
	top, err := New("nvml", gpus, links, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := top.Domains; len(got) != 1 || !slices.Equal(got[0].GPUs, []int{0, 1, 2}) {
		t.Errorf("domains = %v, want [[0 1 2]]", got)
	}
	if !slices.Equal(top.Unlinked, []int{4}) {
		t.Errorf("unlinked = %v, want [4]", top.Unlinked)
	}
	b, err := json.Marshal(top)
	if err != nil {
		t.Fatal(err)
	}
	var back Topology
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if g, _ := back.GPU(5); !g.MIG || !slices.Equal(back.Unlinked, []int{4}) {
		t.Errorf("after a JSON round trip: GPU 5 %+v, unlinked %v", g, back.Unlinked)
	}
	if top.Fingerprint() == plain.Fingerprint() {
		t.Error("turning MIG on left the fingerprint as it was")
	}
	if plain.Fingerprint() != fingerprintBeforeMIG(plain) {
		t.Error("a node without MIG has a new fingerprint")
	}
}

// fingerprintBeforeMIG is Fingerprint as it was before GPU.MIG: an upgrade must not change a
// node's fingerprint, since the NRI plugin drops its holds on a change.
func fingerprintBeforeMIG(t *Topology) string {
	h := sha256.New()
	for _, g := range t.GPUs {
		fmt.Fprintf(h, "gpu %d %s %d\n", g.Index, g.UUID, g.DeviceMinor())
	}
	for _, d := range t.Domains {
		fmt.Fprintf(h, "domain %d %v\n", d.ID, d.GPUs)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

func TestUnmarshalRejectsInconsistentDocuments(t *testing.T) {
	cases := []struct{ doc, want string }{
		{`{"gpus":3,"domains":[],"unlinked":[],"devices":[{"index":0},{"index":1}]}`, "gpus is 3 but 2 devices are listed"},
		{`{"gpus":4,"domains":[{"id":0,"gpus":[2,3]},{"id":1,"gpus":[0,1]}],"unlinked":[],"devices":[{"index":0,"domain":1},{"index":1,"domain":1},{"index":2,"domain":0},{"index":3,"domain":0}]}`,
			"domains[0] has id 0 but domains are numbered by their lowest GPU"},
		{`{"gpus":2,"domains":[{"id":0,"gpus":[0,1]}],"unlinked":[],"devices":[{"index":0,"domain":0},{"index":1}]}`, "device 1 names domain none but the domains list says 0"},
		{`{"gpus":2,"domains":[{"id":0,"gpus":[0,5]}],"unlinked":[],"devices":[{"index":0},{"index":1}]}`, "domains[0].gpus[1]: GPU 5 is not declared"},
	}
	for _, tc := range cases {
		var top Topology
		err := json.Unmarshal([]byte(tc.doc), &top)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error = %v, want %q", err, tc.want)
		}
	}
}

func TestAdversarialGraphStaysFastAndValid(t *testing.T) {
	// Complement of a perfect matching on 60 vertices: 2^30 maximal cliques. The budget
	// must stop the search and still return linked domains.
	n := 60
	l := NewLinks()
	for i := range n {
		for j := i + 1; j < n; j++ {
			if j != i+1 || i%2 == 1 {
				l.Add(i, j)
			}
		}
	}
	top, err := New("t", gpusN(n), l, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range top.Domains {
		for i := range d.GPUs {
			for j := i + 1; j < len(d.GPUs); j++ {
				if !l.Linked(d.GPUs[i], d.GPUs[j]) {
					t.Fatalf("domain %v holds unlinked pair %d-%d", d.GPUs, d.GPUs[i], d.GPUs[j])
				}
			}
		}
	}
	if top.MaxDomainSize() < n/2 {
		t.Errorf("largest domain %d, want at least %d", top.MaxDomainSize(), n/2)
	}
}

package topomatrix

import (
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/nvdomain/nvdomain/pkg/topology"
)

type fixtureCase struct {
	file     string
	gpus     int
	domains  [][]int
	unlinked []int
	// incomplete: the fixture is cut short at its source, so a non-strict parse warns and a
	// strict parse fails.
	incomplete bool
	numa       map[int]int // spot checks of the NUMA Affinity column
}

var fixtureCases = []fixtureCase{
	{file: "hgx-h100-8gpu.txt", gpus: 8, domains: [][]int{{0, 1, 2, 3, 4, 5, 6, 7}}, numa: map[int]int{0: 0, 3: 0, 4: 1, 7: 1}},
	{file: "gb200-4gpu.txt", gpus: 4, domains: [][]int{{0, 1, 2, 3}}, numa: map[int]int{1: 0, 2: 1}},
	{file: "gb200-4gpu-6nic-cut.txt", gpus: 4, domains: [][]int{{0, 1, 2, 3}}},
	{file: "hgx-4x-h100-nv6-4nic.txt", gpus: 4, domains: [][]int{{0, 1, 2, 3}}, numa: map[int]int{0: 3, 1: 1, 2: 7, 3: 5}},
	{file: "dgx1-v100-cube-mesh-mlx5.txt", gpus: 8, domains: [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}},
	{file: "dgx1-v100-cube-mesh-tabs-2nic.txt", gpus: 8, domains: [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}, numa: map[int]int{0: 0, 7: 1}},
	{file: "workstation-4x-rtx3090-nvlink-pairs.txt", gpus: 4, domains: [][]int{{0, 2}, {1, 3}}},
	{file: "pcie-8x-rtx4090-2nic.txt", gpus: 8, unlinked: []int{0, 1, 2, 3, 4, 5, 6, 7}, numa: map[int]int{0: 0, 4: 1}},
	{file: "pcie-5x-rtx4090.txt", gpus: 5, unlinked: []int{0, 1, 2, 3, 4}, numa: map[int]int{0: 1, 1: 0}},
	{file: "workstation-2x-rtx5090-phb.txt", gpus: 2, unlinked: []int{0, 1}},
	{file: "workstation-2x-rtx3090-sys-empty-numa.txt", gpus: 2, unlinked: []int{0, 1}, numa: map[int]int{1: 1}},
	// Cut at the source after the GPU4 row: links among GPU5-7 were never printed. The
	// parser keeps only proven cliques, so GPUs 6 and 7 are left out and it says why.
	{file: "dgx-a100-40gb-12nic-cut.txt", gpus: 8, domains: [][]int{{0, 1, 2, 3, 4, 5}}, unlinked: []int{6, 7}, incomplete: true},
	{file: "dgx2-16x-v100-nvswitch-cut.txt", gpus: 16, domains: [][]int{{0, 1, 2, 3, 4, 5}}, unlinked: []int{6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, incomplete: true},
	{file: "pcie-8x-mlx4-2017-cut.txt", gpus: 8, unlinked: []int{0, 1, 2, 3, 4, 5, 6, 7}, incomplete: true},

	// Pasted into issues, chats and docs (testdata/README.md names each source).
	{file: "v100-8gpu-cube-mesh-blank-lines-no-legend.txt", gpus: 8, domains: [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}},
	{file: "gb300-4gpu-markdown-table.txt", gpus: 4, domains: [][]int{{0, 1, 2, 3}}},
	{file: "l40s-4gpu-pcie-email-prompt-nic-legend.txt", gpus: 4, unlinked: []int{0, 1, 2, 3}, numa: map[int]int{0: 0, 1: 0, 2: 1, 3: 1}},
	{file: "pcie-8x-mlx5-2018-tabs-prose.txt", gpus: 8, unlinked: []int{0, 1, 2, 3, 4, 5, 6, 7}},
	{file: "hgx-h100-8gpu-vllm-env-unindented-header.txt", gpus: 8, domains: [][]int{{0, 1, 2, 3, 4, 5, 6, 7}}, numa: map[int]int{0: 0, 1: 1, 4: 2, 5: 3, 7: 2}},
	// The NIC rows are cut in the copy we could read; every GPU cell is there.
	{file: "hgx-h100-8gpu-10nic-tabs-fenced-cut.txt", gpus: 8, domains: [][]int{{0, 1, 2, 3, 4, 5, 6, 7}}, numa: map[int]int{0: 0, 4: 1}},
	{file: "a100-2gpu-slurm-nv12-10nic-fenced-cut.txt", gpus: 2, domains: [][]int{{0, 1}}, numa: map[int]int{0: 3, 1: 3}},
	{file: "a100-2gpu-nv12-8nic-empty-affinity.txt", gpus: 2, domains: [][]int{{0, 1}}, numa: map[int]int{}},
	{file: "b200-2gpu-16nic-space-tab-header-cut.txt", gpus: 2, domains: [][]int{{0, 1}}, numa: map[int]int{0: 0, 1: 0}},
	// "NIC11NIC12" in the header: one column short, so the rows carry one more link cell than
	// the header names; the GPU columns and the NUMA values must still be read right.
	{file: "b200-8gpu-glued-header-cut.txt", gpus: 8, domains: [][]int{{0, 1, 2, 3, 4, 5}}, unlinked: []int{6, 7}, incomplete: true, numa: map[int]int{0: 0, 3: 0}},
	// The GPU7 row stops after four cells, but every pair is still read from the other half.
	{file: "hgx-8gpu-nv8-9nic-fenced-cut.txt", gpus: 8, domains: [][]int{{0, 1, 2, 3, 4, 5, 6, 7}}, numa: map[int]int{0: 0, 3: 0, 4: 1, 6: 1}},
	{file: "v100-8gpu-hybrid-mesh-vllm-env-cut.txt", gpus: 8, domains: [][]int{{0, 1, 2, 3}}, unlinked: []int{4, 5, 6, 7}, incomplete: true, numa: map[int]int{0: 0, 2: 0}},
	{file: "hgx-8gpu-18nic-root-prompt-cut.txt", gpus: 8, domains: [][]int{{0, 1, 2, 3, 4}}, unlinked: []int{5, 6, 7}, incomplete: true, numa: map[int]int{0: 0, 3: 0}},
}

func readFixture(t testing.TB, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func domainGPUs(top *topology.Topology) [][]int {
	var out [][]int
	for _, d := range top.Domains {
		out = append(out, d.GPUs)
	}
	return out
}

func TestFixturesGiveTheRightDomains(t *testing.T) {
	for _, tc := range fixtureCases {
		t.Run(tc.file, func(t *testing.T) {
			top, err := ParseBytes(readFixture(t, tc.file), Options{})
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			if len(top.GPUs) != tc.gpus {
				t.Errorf("gpus = %d, want %d", len(top.GPUs), tc.gpus)
			}
			if got := domainGPUs(top); !slices.EqualFunc(got, tc.domains, slices.Equal[[]int]) {
				t.Errorf("domains = %v, want %v", got, tc.domains)
			}
			if !slices.Equal(top.Unlinked, tc.unlinked) {
				t.Errorf("unlinked = %v, want %v", top.Unlinked, tc.unlinked)
			}
			if tc.incomplete != (len(top.Warnings) > 0) {
				t.Errorf("warnings = %q, want incomplete=%v", top.Warnings, tc.incomplete)
			}
			for gpu, want := range tc.numa {
				g, _ := top.GPU(gpu)
				if g.NUMANode == nil || *g.NUMANode != want {
					t.Errorf("GPU%d NUMA node = %v, want %d", gpu, g.NUMANode, want)
				}
			}
			_, strictErr := ParseBytes(readFixture(t, tc.file), Options{Strict: true})
			if tc.incomplete != (strictErr != nil) {
				t.Errorf("strict parse error = %v, want error=%v", strictErr, tc.incomplete)
			}
		})
	}
}

func TestCutFixtureSaysWhatIsMissing(t *testing.T) {
	top, err := ParseBytes(readFixture(t, "dgx-a100-40gb-12nic-cut.txt"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	joined := strings.Join(top.Warnings, "\n")
	for _, want := range []string{"no row for GPU5, GPU6, GPU7", "link unknown for 3 GPU pair(s): 5-6, 5-7, 6-7"} {
		if !strings.Contains(joined, want) {
			t.Errorf("warnings %q do not mention %q", top.Warnings, want)
		}
	}
	_, err = ParseBytes(readFixture(t, "dgx-a100-40gb-12nic-cut.txt"), Options{Strict: true})
	if err == nil || !strings.Contains(err.Error(), "topo matrix is incomplete: no row for GPU5, GPU6, GPU7") {
		t.Errorf("strict error = %v", err)
	}
}

// Messy variants are derived from the real fixtures, so each stays tied to real output.
// affinityMayDiffer names the variants that lose what tells a word cut in two from two words
// in the affinity columns (see hardWrap): for them only the links are compared.
var affinityMayDiffer = map[string]bool{"terminal-wrap-80-trimmed": true}

var variants = []struct {
	name      string
	transform func([]byte) []byte
}{
	{"crlf", func(b []byte) []byte { return bytes.ReplaceAll(b, []byte("\n"), []byte("\r\n")) }},
	{"ansi-header", func(b []byte) []byte {
		lines := strings.Split(string(b), "\n")
		for i, l := range lines {
			if strings.Contains(l, "GPU0") {
				lines[i] = "\x1b[1m\x1b[4m" + l + "\x1b[0m"
				break
			}
		}
		return []byte(strings.Join(lines, "\n"))
	}},
	{"ansi-every-cell", func(b []byte) []byte {
		return []byte(strings.NewReplacer("NV", "\x1b[32mNV", "SYS", "\x1b[0mSYS\x1b[0m").Replace(string(b)))
	}},
	{"header-without-leading-whitespace", func(b []byte) []byte {
		lines := strings.Split(string(b), "\n")
		for i, l := range lines {
			if strings.Contains(l, "GPU0") {
				lines[i] = strings.TrimLeft(l, " \t")
				break
			}
		}
		return []byte(strings.Join(lines, "\n"))
	}},
	{"tabs-to-spaces", func(b []byte) []byte { return bytes.ReplaceAll(b, []byte("\t"), []byte("    ")) }},
	{"leading-prose-and-prompt", func(b []byte) []byte {
		return append([]byte("user@node:~$ nvidia-smi topo -m\nWarning: persistence mode is disabled on device 0\n\n"), b...)
	}},
	// What web pages, chat windows and some terminals do to a paste: every newline doubled.
	{"blank-line-between-every-line", func(b []byte) []byte { return bytes.ReplaceAll(b, []byte("\n"), []byte("\n\n")) }},
	{"markdown-code-fence", func(b []byte) []byte { return append(append([]byte("```text\n"), b...), []byte("\n```\n")...) }},
	{"markdown-quote", func(b []byte) []byte { return mapLines(b, func(l string) string { return "> " + l }) }},
	{"markdown-table", markdownTable},
	{"markdown-bold-links", func(b []byte) []byte { return nvCellInText.ReplaceAll(b, []byte("**$1**")) }},
	{"rst-grid-table", func(b []byte) []byte {
		return mapLines(markdownTable(b), func(l string) string {
			if strings.HasPrefix(l, "|---") {
				return strings.ReplaceAll(strings.ReplaceAll(l, "|", "+"), "---", "------")
			}
			return l + "\n+------+"
		})
	}},
	// A terminal 80 columns wide breaks every long line at column 80, inside words too.
	{"terminal-wrap-80", func(b []byte) []byte { return hardWrap(b, 80, false) }},
	{"terminal-wrap-120", func(b []byte) []byte { return hardWrap(b, 120, false) }},
	// The same, copied by a tool that trims the spaces at the end of each screen line.
	{"terminal-wrap-80-trimmed", func(b []byte) []byte { return hardWrap(b, 80, true) }},
	// A mail client or chat window wraps at the last space before its width.
	{"word-wrap-72", func(b []byte) []byte { return wordWrap(b, 72) }},
	{"word-wrap-72-blank-lines", func(b []byte) []byte {
		return bytes.ReplaceAll(wordWrap(b, 72), []byte("\n"), []byte("\n\n"))
	}},
}

var nvCellInText = regexp.MustCompile(`\b(NV[0-9]+)\b`)

func mapLines(b []byte, f func(string) string) []byte {
	lines := strings.Split(string(b), "\n")
	for i, l := range lines {
		lines[i] = f(l)
	}
	return []byte(strings.Join(lines, "\n"))
}

// markdownTable turns every line of the matrix into a Markdown table row, adding the |---| rule
// under the header, the way people tidy output for an issue.
func markdownTable(b []byte) []byte {
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) == 0 {
			out = append(out, l)
			continue
		}
		out = append(out, "| "+strings.Join(f, " | ")+" |")
		if f[0] == "GPU0" && !slices.Contains(f, "X") {
			out = append(out, "|"+strings.Repeat("---|", len(f)))
		}
	}
	return []byte(strings.Join(out, "\n"))
}

// hardWrap breaks lines the way a terminal of the given width does: tabs drawn to 8-column
// stops, then a newline every width columns wherever it falls. With trim, the spaces at the end
// of each screen line are dropped too, and with them the evidence of where the terminal's edge
// was: "48-95,144-191" + "1" then reads like one CPU list cut in two. Link cells never have
// that ambiguity (a cell is a link kind or it is not), so the domains must still come out the
// same.
func hardWrap(b []byte, width int, trim bool) []byte {
	return mapLines(b, func(l string) string {
		var exp strings.Builder
		for _, r := range l {
			if r == '\t' {
				exp.WriteString(strings.Repeat(" ", 8-exp.Len()%8))
				continue
			}
			exp.WriteRune(r)
		}
		s := exp.String()
		var parts []string
		for len(s) > width {
			parts = append(parts, s[:width])
			s = s[width:]
		}
		parts = append(parts, s)
		if trim {
			for i := range parts {
				parts[i] = strings.TrimRight(parts[i], " ")
			}
		}
		return strings.Join(parts, "\n")
	})
}

// wordWrap breaks each line at the last run of whitespace before width, as mail clients do.
func wordWrap(b []byte, width int) []byte {
	return mapLines(b, func(l string) string {
		var parts []string
		for displayWidth(l) > width {
			cut := -1
			for i, r := range l {
				if displayWidth(l[:i]) > width {
					break
				}
				if r == ' ' || r == '\t' {
					cut = i
				}
			}
			if cut <= 0 {
				break
			}
			parts = append(parts, strings.TrimRight(l[:cut], " \t"))
			l = strings.TrimLeft(l[cut:], " \t")
		}
		return strings.Join(append(parts, l), "\n")
	})
}

func TestMessyVariantsParseLikeTheOriginal(t *testing.T) {
	for _, tc := range fixtureCases {
		want, err := ParseBytes(readFixture(t, tc.file), Options{})
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range variants {
			t.Run(tc.file+"/"+v.name, func(t *testing.T) {
				got, err := ParseBytes(v.transform(readFixture(t, tc.file)), Options{})
				if err != nil {
					t.Fatalf("parse: %v", err)
				}
				if !slices.EqualFunc(domainGPUs(got), domainGPUs(want), slices.Equal[[]int]) || !slices.Equal(got.Unlinked, want.Unlinked) {
					t.Errorf("domains %v unlinked %v, want %v %v", domainGPUs(got), got.Unlinked, domainGPUs(want), want.Unlinked)
				}
				if g, w := numaNodes(got), numaNodes(want); !maps.Equal(g, w) && !affinityMayDiffer[v.name] {
					t.Errorf("NUMA nodes %v, want %v", g, w)
				}
				if len(got.Warnings) != len(want.Warnings) {
					t.Errorf("warnings %q, want as many as the original's %q", got.Warnings, want.Warnings)
				}
			})
		}
	}
}

// A terminal narrower than the matrix cuts every line. The parser must never invent a link:
// each domain it reports sits inside a domain of the full output.
func TestColumnsCutByTerminalWidthNeverInventLinks(t *testing.T) {
	for _, tc := range fixtureCases {
		full, err := ParseBytes(readFixture(t, tc.file), Options{})
		if err != nil {
			t.Fatal(err)
		}
		for _, width := range []int{12, 24, 40, 56, 80, 120} {
			lines := strings.Split(strings.ReplaceAll(string(readFixture(t, tc.file)), "\t", "        "), "\n")
			for i, l := range lines {
				if len(l) > width {
					lines[i] = l[:width]
				}
			}
			cut, err := ParseBytes([]byte(strings.Join(lines, "\n")), Options{})
			if err != nil {
				continue // a header cut before GPU0 is a clear error, which is fine
			}
			for _, d := range cut.Domains {
				if !insideSomeDomain(d.GPUs, full) {
					t.Errorf("%s cut at %d columns: domain %v is not inside any domain of the full output %v", tc.file, width, d.GPUs, domainGPUs(full))
				}
			}
		}
	}
}

func TestHeaderCutAt40ColumnsKeepsWhatItSaw(t *testing.T) {
	lines := strings.Split(string(readFixture(t, "hgx-h100-8gpu.txt")), "\n")
	for i, l := range lines {
		if len(l) > 40 {
			lines[i] = l[:40]
		}
	}
	top, err := ParseBytes([]byte(strings.Join(lines, "\n")), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := domainGPUs(top); !slices.EqualFunc(got, [][]int{{0, 1, 2, 3, 4}}, slices.Equal[[]int]) {
		t.Errorf("domains = %v", got)
	}
	if len(top.Warnings) == 0 || !strings.Contains(top.Warnings[0], "link unknown") {
		t.Errorf("warnings = %q, want the unknown links named", top.Warnings)
	}
}

func numaNodes(top *topology.Topology) map[int]int {
	out := map[int]int{}
	for _, g := range top.GPUs {
		if g.NUMANode != nil {
			out[g.Index] = *g.NUMANode
		}
	}
	return out
}

func insideSomeDomain(gpus []int, top *topology.Topology) bool {
	for _, d := range top.Domains {
		all := true
		for _, g := range gpus {
			all = all && slices.Contains(d.GPUs, g)
		}
		if all {
			return true
		}
	}
	return false
}

func TestBadInputGivesClearErrors(t *testing.T) {
	cases := []struct {
		name, input, want string
	}{
		{"empty", "", "no header line found"},
		{"nvidia-smi failed", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", "no header line found"},
		{"misaligned row", "\tGPU0\tGPU1\nGPU0\tNV4\tX\nGPU1\tX\tNV4\n", `row GPU0 has "NV4" in its own column where X belongs`},
		{"duplicate row", "\tGPU0\tGPU1\nGPU0\tX\tNV4\nGPU0\tX\tNV4\n", "row GPU0 appears twice"},
		{"duplicate column", "\tGPU0\tGPU0\nGPU0\tX\tNV4\n", "header names column GPU0 twice"},
		{"too big", strings.Repeat("x", MaxInputBytes+1), "larger than"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(strings.NewReader(tc.input), Options{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestDisagreeingCellsAreNotALink(t *testing.T) {
	in := "\tGPU0\tGPU1\tGPU2\nGPU0\tX\tNV4\tNV4\nGPU1\tSYS\tX\tNV4\nGPU2\tNV4\tNV4\tX\n"
	top, err := ParseBytes([]byte(in), Options{})
	if err != nil {
		t.Fatal(err)
	}
	// 0-1 disagree, so the largest proven clique is {0,2} or {1,2}; lowest first wins.
	if got := domainGPUs(top); !slices.EqualFunc(got, [][]int{{0, 2}}, slices.Equal[[]int]) {
		t.Errorf("domains = %v", got)
	}
	if len(top.Warnings) != 1 || !strings.Contains(top.Warnings[0], "GPU0→GPU1 says NV4 but GPU1→GPU0 says SYS") {
		t.Errorf("warnings = %q", top.Warnings)
	}
	if _, err := ParseBytes([]byte(in), Options{Strict: true}); err == nil {
		t.Error("strict parse accepted disagreeing cells")
	}
}

func FuzzParse(f *testing.F) {
	entries, err := os.ReadDir("testdata")
	if err != nil {
		f.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".txt") {
			f.Add(readFixture(f, e.Name()))
			// The pasted forms too, so the fuzzer starts from Markdown, wrapped and
			// blank-line-separated input as well as from plain output.
			for _, v := range variants {
				f.Add(v.transform(readFixture(f, e.Name())))
			}
		}
	}
	f.Add([]byte("GPU0 GPU1\nGPU0 X NV1\nGPU1 NV1 X\n"))
	f.Add([]byte("\tGPU0\tGPU1\r\nGPU0\t X \tNV2\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		top, err := ParseBytes(data, Options{})
		if err != nil {
			return
		}
		checkInvariants(t, top)
		// Whatever parses must survive the JSON round trip the agent uses.
		b, err := json.Marshal(top)
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		var back topology.Topology
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatalf("round trip of %s: %v", b, err)
		}
	})
}

func checkInvariants(t *testing.T, top *topology.Topology) {
	t.Helper()
	seen := map[int]int{}
	for i, d := range top.Domains {
		if d.ID != i || len(d.GPUs) < 2 || !slices.IsSorted(d.GPUs) {
			t.Fatalf("domain %d malformed: %+v", i, d)
		}
		if i > 0 && top.Domains[i-1].GPUs[0] >= d.GPUs[0] {
			t.Fatalf("domain ids not in order of lowest GPU: %v", top.Domains)
		}
		for _, g := range d.GPUs {
			seen[g]++
		}
	}
	for _, g := range top.Unlinked {
		seen[g]++
	}
	if len(seen) != len(top.GPUs) {
		t.Fatalf("%d GPUs but %d placed", len(top.GPUs), len(seen))
	}
	for g, n := range seen {
		if n != 1 {
			t.Fatalf("GPU %d placed %d times", g, n)
		}
	}
}

// Focused cases, each cut from a real fixture (named in the case) down to what it exercises.
func TestPastedFormats(t *testing.T) {
	cases := []struct {
		name      string
		input     string
		domains   [][]int
		unlinked  []int
		numa      map[int]int
		warning   string // a substring of one warning; "" means no warnings
		strictErr bool
	}{
		{
			// b200-8gpu-glued-header-cut.txt's neighbour in vLLM reports: the last NIC glued to
			// the CPU Affinity heading.
			name:    "NIC glued to the CPU Affinity heading",
			input:   "        GPU0    GPU1    NIC0    NIC1CPU Affinity     NUMA Affinity   GPU NUMA ID\nGPU0     X      NV18    PIX     SYS  0-27,112-139     0               N/A\nGPU1    NV18     X      SYS     PIX  28-55,140-167    1               N/A\n",
			domains: [][]int{{0, 1}},
			numa:    map[int]int{0: 0, 1: 1},
		},
		{
			// club-3090 issues paste `topo -m` and then `topo -p2p rw`; without a legend in
			// between, the second matrix must not be read as rows of the first.
			name:     "a second matrix right after the first",
			input:    "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\nGPU0\t X \tPHB\t0-63\t0\t\tN/A\nGPU1\tPHB\t X \t0-63\t0\t\tN/A\n \tGPU0\tGPU1\t\n GPU0\tX\tGNS\t\n GPU1\tGNS\tX\t\n",
			unlinked: []int{0, 1},
			numa:     map[int]int{0: 0, 1: 0},
		},
		{
			name:      "an unreadable cell whose other half says NV# is a link, with a warning",
			input:     "\tGPU0\tGPU1\tGPU2\nGPU0\t X \tNV4??\tSYS\nGPU1\tNV4\t X \tSYS\nGPU2\tSYS\tSYS\t X \n",
			domains:   [][]int{{0, 1}},
			unlinked:  []int{2},
			warning:   `GPU0→GPU1 "NV4??"`,
			strictErr: true,
		},
		{
			name:      "a pair whose cells are both unreadable is not linked",
			input:     "\tGPU0\tGPU1\nGPU0\t X \tNV-\nGPU1\tN?V4\t X \n",
			unlinked:  []int{0, 1},
			warning:   "2 cell(s) are not a link kind",
			strictErr: true,
		},
		{
			// The Markdown tables in testdata/gb300-4gpu-markdown-table.txt, with emphasis on
			// the links as some write them.
			name:    "Markdown table with bold links and a rule",
			input:   "| | GPU0 | GPU1 | GPU2 |\n|---|---|---|---|\n| GPU0 | X | **NV4** | NODE |\n| GPU1 | **NV4** | X | NODE |\n| GPU2 | NODE | NODE | X |\n",
			domains: [][]int{{0, 1}}, unlinked: []int{2},
		},
		{
			// A row wrapped by a mail client at a space, then the legend: the legend must not
			// be taken for the rest of the row.
			name:    "word-wrapped row followed by the legend",
			input:   "        GPU0    GPU1    CPU Affinity    NUMA Affinity\nGPU0     X      NV12    48-63,176-191\n3\nGPU1    NV12     X      48-63,176-191\n3\n\nLegend:\n\n  X    = Self\n",
			domains: [][]int{{0, 1}},
			numa:    map[int]int{0: 3, 1: 3},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			top, err := ParseBytes([]byte(tc.input), Options{})
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			if got := domainGPUs(top); !slices.EqualFunc(got, tc.domains, slices.Equal[[]int]) {
				t.Errorf("domains = %v, want %v", got, tc.domains)
			}
			if !slices.Equal(top.Unlinked, tc.unlinked) {
				t.Errorf("unlinked = %v, want %v", top.Unlinked, tc.unlinked)
			}
			if tc.numa != nil && !maps.Equal(numaNodes(top), tc.numa) {
				t.Errorf("NUMA nodes = %v, want %v", numaNodes(top), tc.numa)
			}
			joined := strings.Join(top.Warnings, "\n")
			if (tc.warning == "") != (joined == "") || !strings.Contains(joined, tc.warning) {
				t.Errorf("warnings = %q, want one containing %q", top.Warnings, tc.warning)
			}
			if _, err := ParseBytes([]byte(tc.input), Options{Strict: true}); (err != nil) != tc.strictErr {
				t.Errorf("strict parse error = %v, want error=%v", err, tc.strictErr)
			}
		})
	}
}

package cli

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nvdomain/nvdomain/pkg/topology/topomatrix"
)

func runCLI(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = Main(context.Background(), args, strings.NewReader(stdin), &out, &errb)
	return code, out.String(), errb.String()
}

type summary struct {
	GPUs    int `json:"gpus"`
	Domains []struct {
		ID   int   `json:"id"`
		GPUs []int `json:"gpus"`
	} `json:"domains"`
	Unlinked []int  `json:"unlinked"`
	Node     string `json:"node"`
}

// Every fixture goes through the command exactly as an operator would run it, and must print
// the document the library computes.
func TestParseEveryTopoMatrixFixture(t *testing.T) {
	files, _ := filepath.Glob("../topology/topomatrix/testdata/*.txt")
	if len(files) < 12 {
		t.Fatalf("only %d fixtures", len(files))
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			code, out, errOut := runCLI(t, "", "topology", "parse", "--format", "topo-matrix", f, "-o", "json")
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			data, _ := os.ReadFile(f)
			want, err := topomatrix.ParseBytes(data, topomatrix.Options{})
			if err != nil {
				t.Fatal(err)
			}
			wantJSON, _ := json.Marshal(want)
			var got, exp any
			_ = json.Unmarshal([]byte(out), &got)
			_ = json.Unmarshal(wantJSON, &exp)
			g, _ := json.Marshal(got)
			e, _ := json.Marshal(exp)
			if string(g) != string(e) {
				t.Errorf("CLI printed\n%s\nlibrary computed\n%s", g, e)
			}
		})
	}
}

func TestParseSummaries(t *testing.T) {
	cases := []struct {
		args         []string
		stdin        string
		wantGPUs     int
		wantDomains  string
		wantUnlinked string
	}{
		{[]string{"topology", "parse", "../topology/topomatrix/testdata/dgx1-v100-cube-mesh-mlx5.txt"}, "", 8, "[[0,1,2,3],[4,5,6,7]]", "[]"},
		{[]string{"topology", "parse", "--format", "topo-matrix", "-"}, mustRead(t, "../topology/topomatrix/testdata/hgx-h100-8gpu.txt"), 8, "[[0,1,2,3,4,5,6,7]]", "[]"},
		{[]string{"topology", "parse", "../topology/topomatrix/testdata/pcie-8x-rtx4090-2nic.txt"}, "", 8, "[]", "[0,1,2,3,4,5,6,7]"},
		// Pasted forms through stdin: blank lines between rows, and a Markdown table.
		{[]string{"topology", "parse", "--format", "topo-matrix", "-"}, mustRead(t, "../topology/topomatrix/testdata/v100-8gpu-cube-mesh-blank-lines-no-legend.txt"), 8, "[[0,1,2,3],[4,5,6,7]]", "[]"},
		{[]string{"topology", "parse", "-"}, mustRead(t, "../topology/topomatrix/testdata/gb300-4gpu-markdown-table.txt"), 4, "[[0,1,2,3]]", "[]"},
		{[]string{"topology", "parse", "--format", "simulated", "../topology/simulated/testdata/seed-node.json"}, "", 8, "[[0,1,2,3],[4,5,6,7]]", "[]"},
		{[]string{"topology", "parse", "--format", "simulated", "--node", "pcie-l40s-c", "../topology/simulated/testdata/mixed-cluster.json"}, "", 4, "[]", "[0,1,2,3]"},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, out, errOut := runCLI(t, tc.stdin, tc.args...)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			var s summary
			if err := json.Unmarshal([]byte(out), &s); err != nil {
				t.Fatalf("output is not one JSON object: %v\n%s", err, out)
			}
			var doms [][]int
			for _, d := range s.Domains {
				doms = append(doms, d.GPUs)
			}
			if doms == nil {
				doms = [][]int{}
			}
			gotDomains, _ := json.Marshal(doms)
			gotUnlinked, _ := json.Marshal(s.Unlinked)
			if s.GPUs != tc.wantGPUs || string(gotDomains) != tc.wantDomains || string(gotUnlinked) != tc.wantUnlinked {
				t.Errorf("gpus %d domains %s unlinked %s; want %d %s %s", s.GPUs, gotDomains, gotUnlinked, tc.wantGPUs, tc.wantDomains, tc.wantUnlinked)
			}
		})
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestSimulatedDocumentWithSeveralNodesPrintsAnArray(t *testing.T) {
	code, out, _ := runCLI(t, "", "topology", "parse", "--format", "simulated", "../topology/simulated/testdata/mixed-cluster.json")
	var items []summary
	if code != 0 || json.Unmarshal([]byte(out), &items) != nil || len(items) != 4 || items[3].Node != "workstation-d" {
		t.Fatalf("exit %d, output %s", code, out)
	}
}

func TestTableOutput(t *testing.T) {
	code, out, _ := runCLI(t, "", "topology", "parse", "--format", "simulated", "../topology/simulated/testdata/seed-node.json", "-o", "table")
	want := `node: gpu-node01
source: simulated  gpus: 8  domains: 2  largest domain: 4
DOMAIN  SIZE  GPUS     NUMA  PRODUCT
0       4     0,1,2,3  -     NVIDIA H100 80GB HBM3
1       4     4,5,6,7  -     NVIDIA H100 80GB HBM3
unlinked: none
`
	if code != 0 || out != want {
		t.Fatalf("exit %d, got\n%s\nwant\n%s", code, out, want)
	}
	code, out, _ = runCLI(t, "", "topology", "parse", "../topology/topomatrix/testdata/dgx-a100-40gb-12nic-cut.txt", "-o", "table")
	if code != 0 || !strings.Contains(out, "0       6     0,1,2,3,4,5  1,3") || !strings.Contains(out, "warning: no row for GPU5, GPU6, GPU7") {
		t.Fatalf("exit %d, got\n%s", code, out)
	}
}

func TestErrors(t *testing.T) {
	cases := []struct {
		name  string
		args  []string
		code  int
		inErr string
	}{
		{"strict on a cut matrix", []string{"topology", "parse", "--strict", "../topology/topomatrix/testdata/dgx-a100-40gb-12nic-cut.txt"}, 2, "topo matrix is incomplete"},
		{"bad output", []string{"topology", "parse", "-o", "yaml", "../topology/topomatrix/testdata/gb200-4gpu.txt"}, 2, `--output "yaml": use json or table`},
		{"bad format", []string{"topology", "parse", "--format", "xml", "../topology/topomatrix/testdata/gb200-4gpu.txt"}, 2, `--format "xml": use topo-matrix or simulated`},
		{"missing file", []string{"topology", "parse", "/nonexistent/topo.txt"}, 2, "read /nonexistent/topo.txt"},
		{"not a matrix", []string{"topology", "parse", "../checkconfig/testdata/lab-ok.json"}, 2, "no header line found"},
		{"invalid simulated", []string{"topology", "parse", "--format", "simulated", "../topology/topomatrix/testdata/gb200-4gpu.txt"}, 2, "invalid JSON at line 1"},
		{"unknown simulated node", []string{"topology", "parse", "--format", "simulated", "--node", "x", "../topology/simulated/testdata/seed-node.json"}, 2, `node "x" is not in the simulated topology`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errOut := runCLI(t, "", tc.args...)
			if code != tc.code || !strings.Contains(errOut, tc.inErr) {
				t.Fatalf("exit %d stderr %q; want exit %d and %q", code, errOut, tc.code, tc.inErr)
			}
		})
	}
}

func TestCheckConfig(t *testing.T) {
	bad := `{"kind":"List","items":[{"metadata":{"name":"gpu-1","labels":{"nvidia.com/gpu.workload.config":"vm-vgpu"}},"status":{"capacity":{"nvidia.com/gpu":"4"}}}]}`
	cases := []struct {
		name, stdin string
		args        []string
		code        int
		out, errOut string
	}{
		{"three-node lab", "", []string{"check-config", "../checkconfig/testdata/lab-ok.json"}, 0, "OK=3\n", ""},
		{"mismatch from stdin", bad, []string{"check-config", "-"}, 1, "MISMATCH=gpu-1 label nvidia.com/gpu.workload.config=vm-vgpu but the node advertises nvidia.com/gpu", ""},
		{"invalid JSON", "{oops", []string{"check-config", "-"}, 2, "", "nvdomain: -: node dump is not valid JSON"},
		{"unreadable file", "", []string{"check-config", "/nonexistent/nodes.json"}, 2, "", "nvdomain: read /nonexistent/nodes.json"},
		{"no argument", "", []string{"check-config"}, 2, "", "accepts 1 arg(s), received 0"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, tc.stdin, tc.args...)
			if code != tc.code || !strings.HasPrefix(out, tc.out) || !strings.Contains(errOut, tc.errOut) {
				t.Fatalf("exit %d out %q err %q; want exit %d, out %q, err containing %q", code, out, errOut, tc.code, tc.out, tc.errOut)
			}
		})
	}
}

func TestDiscoverWithoutADriverFailsClearly(t *testing.T) {
	code, out, errOut := runCLI(t, "", "topology", "discover", "-o", "table")
	if code == 0 {
		// A GPU node: the table must be there.
		if !strings.Contains(out, "source: nvml") {
			t.Fatalf("discover succeeded but printed %q", out)
		}
		return
	}
	if code != 2 || !strings.Contains(errOut, "nvdomain: NVML:") {
		t.Fatalf("exit %d stderr %q", code, errOut)
	}
}

func TestCertsGenerate(t *testing.T) {
	dir := t.TempDir()
	code, out, errOut := runCLI(t, "", "certs", "generate", "--out-dir", dir, "--host", "127.0.0.1")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	ca, err := base64.StdEncoding.DecodeString(strings.TrimSpace(out))
	if err != nil || !strings.Contains(string(ca), "BEGIN CERTIFICATE") {
		t.Fatalf("stdout is not a base64 caBundle: %q", out)
	}
	for _, f := range []string{"ca.crt", "tls.crt", "tls.key"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Error(err)
		}
	}
	if code, _, errOut := runCLI(t, "", "certs", "generate"); code != 2 || !strings.Contains(errOut, "--out-dir is required") {
		t.Errorf("exit %d stderr %q", code, errOut)
	}
}

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
	sick := `{"nodes": [{"name": "n", "gpus": [{"index": 0}, {"index": 1, "health": "row remapping failed"}], "domains": [{"id": 0, "gpus": [0, 1]}]}]}`
	code, out, _ = runCLI(t, sick, "topology", "parse", "--format", "simulated", "-", "-o", "table")
	if code != 0 || !strings.Contains(out, "unhealthy: GPU 1: row remapping failed\n") || strings.Contains(out, "GPU 0:") {
		t.Fatalf("exit %d, got\n%s", code, out)
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
		{"no GPU node in the dump", `{"kind":"List","items":[{"kind":"Node","metadata":{"name":"cpu-1"}}]}`, []string{"check-config", "-"}, 1, "NONE=1 nodes in the dump, none with nvidia.com/gpu.workload.config", ""},
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

func TestCheckConfigMIGAndTimeSlicing(t *testing.T) {
	const td = "../checkconfig/testdata/"
	mig := []string{"--mig-config", td + "default-mig-parted-config.yaml", "--now", "2026-03-01T10:00:00Z"}
	cases := []struct {
		name string
		args []string
		code int
		out  string // the whole stdout
		err  string // a substring of stderr
	}{
		{"mixed, right count", append([]string{"check-config", td + "mig-mixed-ok.json"}, mig...), 0, "OK=1\n", ""},
		{"mixed, wrong count", append([]string{"check-config", td + "mig-mixed-wrong-count.json"}, mig...), 1,
			"MISMATCH=a100-mixed-2 label nvidia.com/mig.config=all-1g.5gb (mixed strategy, 8 GPUs): nvidia.com/gpu=1 advertised, none expected; nvidia.com/mig-1g.5gb=56 expected, 48 advertised; if mig-manager reports success, restart the device plugin on the node, else fix the label\n", ""},
		{"single, wrong count", append([]string{"check-config", td + "mig-single-wrong.json"}, mig...), 1,
			"MISMATCH=a100-single-2 label nvidia.com/mig.config=all-1g.5gb (single strategy, 8 GPUs): nvidia.com/gpu=56 expected, 8 advertised; if mig-manager reports success, restart the device plugin on the node, else fix the label\n", ""},
		{"config name not in the file", append([]string{"check-config", td + "mig-unknown-config.json"}, mig...), 1,
			"MISMATCH=a100-typo-1 label nvidia.com/mig.config=all-1g.5gb-typo names no config in --mig-config ../checkconfig/testdata/default-mig-parted-config.yaml (it has 81: all-1g.10gb, all-1g.10gb.me, all-1g.12gb, all-1g.12gb.me, all-1g.18gb, all-1g.18gb.me and 75 more); fix the label or add the config to the file\n", ""},
		{"pending for two hours", append([]string{"check-config", td + "mig-state-pending-too-long.json"}, mig...), 1,
			"MISMATCH=a100-stuck-1 label nvidia.com/mig.config.state=pending for 2h0m0s (last written 2026-03-01T08:00:00Z), longer than --mig-pending-timeout 30m0s: mig-manager is stuck applying nvidia.com/mig.config=all-3g.20gb; see its log on this node\n", ""},
		{"pending for two hours, timeout 3h", append([]string{"check-config", td + "mig-state-pending-too-long.json", "--mig-pending-timeout", "3h"}, mig...), 0, "OK=1\n", ""},
		{"rebooting for ten minutes", append([]string{"check-config", td + "mig-state-pending-recent.json"}, mig...), 0, "OK=1\n", ""},
		{"pending without a timestamp", []string{"check-config", td + "mig-state-pending-no-timestamp.json"}, 0, "OK=1\n", ""},
		{"pending without a timestamp, counted", []string{"check-config", td + "mig-state-pending-no-timestamp.json", "--mig-pending-no-timestamp", "mismatch"}, 1,
			"MISMATCH=a100-applying-2 label nvidia.com/mig.config.state=pending and the dump does not tell since when (no managedFields entry owns the label: dump with kubectl get nodes -o json --show-managed-fields); --mig-pending-no-timestamp=mismatch counts that as a mismatch\n", ""},
		{"time-slicing renamed, wrong", []string{"check-config", td + "timeslicing-renamed-wrong.json"}, 1,
			"MISMATCH=a10g-shared-2 time-slicing nvidia.com/gpu.replicas=4 on 4 GPUs (nvidia.com/gpu.count), renamed (nvidia.com/gpu.shared): nvidia.com/gpu.shared=16 expected, 4 advertised; the device plugin's sharing config and GFD's labels disagree, restart both on the node\n", ""},
		{"time-slicing, right", []string{"check-config", td + "timeslicing-ok.json"}, 0, "OK=1\n", ""},
		{"bad --mig-config file", []string{"check-config", td + "mig-mixed-ok.json", "--mig-config", td + "lab-ok.json"}, 2, "",
			"nvdomain: --mig-config ../checkconfig/testdata/lab-ok.json: a List of 4 object(s) (kinds: Node), not one ConfigMap; pass the ConfigMap named in ClusterPolicy spec.migManager.config.name (GPU Operator's is default-mig-parted-config)"},
		{"missing --mig-config file", []string{"check-config", td + "mig-mixed-ok.json", "--mig-config", "/nonexistent/cm.yaml"}, 2, "", "nvdomain: --mig-config: open /nonexistent/cm.yaml"},
		{"bad --now", []string{"check-config", td + "mig-mixed-ok.json", "--now", "yesterday"}, 2, "", `--now "yesterday": use an RFC 3339 time such as 2026-03-01T10:00:00Z`},
		{"bad --mig-pending-no-timestamp", []string{"check-config", td + "mig-mixed-ok.json", "--mig-pending-no-timestamp", "warn"}, 2, "", `--mig-pending-no-timestamp "warn": use ok or mismatch`},
		{"negative --mig-pending-timeout", []string{"check-config", td + "mig-mixed-ok.json", "--mig-pending-timeout", "-5m"}, 2, "", "--mig-pending-timeout -5m0s: use a positive duration"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, "", tc.args...)
			if code != tc.code || out != tc.out || !strings.Contains(errOut, tc.err) {
				t.Fatalf("exit %d out %q err %q\nwant exit %d out %q err containing %q", code, out, errOut, tc.code, tc.out, tc.err)
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

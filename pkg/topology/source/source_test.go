package source

import (
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nvdomain/nvdomain/pkg/topology"
	"github.com/nvdomain/nvdomain/pkg/topology/simulated"
)

func TestFileSources(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	top, _ := topology.FromDomains("simulated", []topology.GPU{{Index: 0}, {Index: 1}}, [][]int{{0, 1}}, nil)
	doc, _ := json.Marshal(top)
	parser, err := simulated.NewParser()
	if err != nil {
		t.Fatal(err)
	}
	matrix, _ := os.ReadFile("../topomatrix/testdata/dgx1-v100-cube-mesh-mlx5.txt")
	cut, _ := os.ReadFile("../topomatrix/testdata/dgx-a100-40gb-12nic-cut.txt")
	cases := []struct {
		name    string
		src     Source
		domains int
		err     string
	}{
		{"topology JSON", JSONFile{Path: write("t.json", string(doc))}, 1, ""},
		{"broken topology JSON", JSONFile{Path: write("bad.json", "{")}, 0, "topology file"},
		{"topo matrix", TopoMatrixFile{Path: write("m.txt", string(matrix))}, 2, ""},
		{"a cut matrix is refused, never half published", TopoMatrixFile{Path: write("cut.txt", string(cut))}, 0, "topo matrix is incomplete"},
		{"simulated document", SimulatedFile{Path: write("s.json", `{"nodes":[{"name":"n1","gpuCount":4,"domains":[{"gpus":[0,1]},{"gpus":[2,3]}]}]}`), Node: "n1", Parser: parser}, 2, ""},
		{"simulated document without this node", SimulatedFile{Path: write("s2.json", `{"nodes":[{"name":"n2","gpuCount":4}]}`), Node: "n1", Parser: parser}, 0, `node "n1" is not in the simulated topology`},
		{"missing file", TopoMatrixFile{Path: filepath.Join(dir, "nope")}, 0, "no such file"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.src.Load(context.Background())
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || len(got.Domains) != tc.domains || tc.src.Changes() != nil || tc.src.Describe() == "" {
				t.Fatalf("got %v, %v", got, err)
			}
		})
	}
}

// The agent and the NRI plugin choose their topology source with the same flags; the NRI
// plugin's older spellings (a file alone, --nvml) still choose the same source.
func TestFlagsNameTheFlagAtFault(t *testing.T) {
	cases := []struct {
		args []string
		def  string
		want string // Source after Infer, or the Validate error
	}{
		{[]string{"--source=nvml"}, "", "nvml"},
		{[]string{"--topo-matrix-file=/x"}, "", "topo-matrix"},
		{[]string{"--topology-file=/x"}, "", "file"},
		{[]string{"--simulated-file=/x"}, "", "simulated"},
		{[]string{}, "nvml", "nvml"},
		{[]string{"--source=topo-matrix"}, "", "--source topo-matrix needs --topo-matrix-file"},
		{[]string{"--source=file"}, "", "--source file needs --topology-file"},
		{[]string{"--source=dcgm"}, "", `--source "dcgm": use nvml, topo-matrix, simulated or file`},
		{[]string{}, "", "no topology source: give --source nvml, topo-matrix, simulated or file"},
	}
	for _, tc := range cases {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		var f Flags
		f.AddFlags(fs, tc.def)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		f.Infer()
		got := f.Source
		if err := f.Validate(false); err != nil {
			got = err.Error()
		}
		if got != tc.want {
			t.Errorf("%v: %q, want %q", tc.args, got, tc.want)
		}
	}
}

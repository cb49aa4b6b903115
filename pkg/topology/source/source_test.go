package source

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/nvdomain/nvdomain/pkg/names"
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

// --nvml-xid-ignore reads a list of XIDs or none, and names the flag and the bad entry.
func TestXIDIgnoreFlag(t *testing.T) {
	cases := []struct {
		args []string
		want string // the list, or the parse error's text
	}{
		{nil, "[13 31 43 45 63 68 92 94 109]"},
		{[]string{"--nvml-xid-ignore=13, 31,"}, "[13 31]"},
		{[]string{"--nvml-xid-ignore=none"}, "[]"},
		{[]string{"--nvml-xid-ignore=13,x"}, `--nvml-xid-ignore: "x" is not an XID`},
		{[]string{"--nvml-xid-ignore=0"}, `--nvml-xid-ignore: "0" is not an XID`},
		{[]string{"--nvml-xid-ignore="}, "--nvml-xid-ignore is empty: give XIDs (e.g. 13,31,43,45,63,68,92,94,109, the default) or none"},
	}
	for _, tc := range cases {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var f Flags
		f.AddFlags(fs, "nvml")
		err := fs.Parse(tc.args)
		got := fmt.Sprint(f.NVMLXIDIgnore)
		if err != nil {
			got = err.Error()
		}
		if !strings.Contains(got, tc.want) {
			t.Errorf("%v: %q, want %q", tc.args, got, tc.want)
		}
	}
}

// A node the simulated file does not list takes the shape of the pool its labels match (the
// NRI plugin's path on a node an autoscaler added); a failed label read falls back to the
// last labels read.
func TestSimulatedFileResolvesPoolsByLabels(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "topology.json")
	doc := `{"nodes":[{"name":"listed","gpuCount":2,"domains":[{"gpus":[0,1]}]}],
	 "pools":[{"name":"split","nodeSelector":{"karpenter.sh/nodepool":"split"},"gpuCount":8,"domains":[{"gpus":[0,1,2,3]},{"gpus":[4,5,6,7]}]}]}`
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "split-abc", Labels: map[string]string{"karpenter.sh/nodepool": "split"}}})
	f := Flags{Source: names.SourceSimulated, SimulatedFile: path}
	src, err := f.Open("split-abc", KubeNodeLabels(cs, "split-abc"))
	if err != nil {
		t.Fatal(err)
	}
	top, err := src.Load(context.Background())
	if err != nil || len(top.Domains) != 2 || top.MaxDomainSize() != 4 {
		t.Fatalf("pool node: %v %+v", err, top)
	}
	// The apiserver fails now: the last labels stand.
	cs.PrependReactor("get", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	if top, err := src.Load(context.Background()); err != nil || len(top.Domains) != 2 {
		t.Fatalf("with the apiserver down: %v", err)
	}
	// A listed node is found by name, without reading labels; without labels a pool node is not.
	if src, _ := f.Open("listed", nil); src != nil {
		if top, err := src.Load(context.Background()); err != nil || top.MaxDomainSize() != 2 {
			t.Fatalf("listed node: %v", err)
		}
	}
	noLabels, _ := f.Open("split-abc", nil)
	if _, err := noLabels.Load(context.Background()); err == nil || !strings.Contains(err.Error(), `node "split-abc" is not in the simulated topology`) {
		t.Fatalf("a pool node without labels: %v", err)
	}
	// A node whose first label read fails gets the error.
	down := fake.NewClientset()
	down.PrependReactor("get", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	src, _ = f.Open("split-abc", KubeNodeLabels(down, "split-abc"))
	if _, err := src.Load(context.Background()); err == nil || !strings.Contains(err.Error(), "read node split-abc's labels") {
		t.Fatalf("first read failing: %v", err)
	}
}

package nristate

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteReadAndUnpinnedUsage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run", "nri-state.json")
	in := []Assignment{
		{ContainerID: "a", GPUs: []int{4, 5}, Domain: 1},
		{ContainerID: "b", GPUs: []int{6}, Domain: -1},
		{ContainerID: "c", GPUs: []int{0, 8}, Domain: -1}, // GPU 8 is in no domain
	}
	if ok, err := Write(path, Doc{Generation: 10, Assignments: in}); err != nil || !ok {
		t.Fatal(ok, err)
	}
	doc, err := Read(path)
	if err != nil || doc.Version != 1 || len(doc.Assignments) != 3 {
		t.Fatalf("read back %+v, %v", doc, err)
	}
	domainOf := func(g int) (int, bool) {
		if g >= 8 {
			return 0, false
		}
		return g / 4, true
	}
	got := UnpinnedByDomain(doc, domainOf)
	if len(got) != 2 || got[0] != 1 || got[1] != 1 {
		t.Errorf("unpinned by domain = %v, want map[0:1 1:1]", got)
	}
	if len(UnpinnedByDomain(nil, domainOf)) != 0 {
		t.Error("a missing document must mean no usage")
	}
	if ok, err := Write(path, Doc{Generation: 11}); err != nil || !ok {
		t.Fatal(ok, err)
	}
	data, _ := os.ReadFile(path)
	if !strings.Contains(string(data), `"assignments": []`) {
		t.Errorf("empty state is not an empty list: %s", data)
	}
	if entries, _ := os.ReadDir(filepath.Dir(path)); len(entries) != 2 { // the file and its lock
		t.Errorf("temporary files left: %v", entries)
	}
}

func TestAnOlderSnapshotNeverReplacesANewerOne(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nri-state.json")
	newer := Doc{Generation: 200, Assignments: []Assignment{{ContainerID: "new", GPUs: []int{1}, Domain: 0}}}
	older := Doc{Generation: 100, Assignments: []Assignment{{ContainerID: "old", GPUs: []int{2}, Domain: 0}}}
	if ok, err := Write(path, newer); err != nil || !ok {
		t.Fatal(ok, err)
	}
	// A plugin that was shutting down flushes after its replacement wrote.
	if ok, err := Write(path, older); err != nil || ok {
		t.Fatalf("older snapshot written = %v, %v", ok, err)
	}
	doc, err := Read(path)
	if err != nil || doc.Generation != 200 || doc.Assignments[0].ContainerID != "new" {
		t.Fatalf("file holds %+v, %v", doc, err)
	}
}

func TestReadErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := Read(filepath.Join(dir, "missing.json")); err == nil {
		t.Error("missing file accepted")
	}
	bad := filepath.Join(dir, "bad.json")
	_ = os.WriteFile(bad, []byte("{"), 0o644)
	if _, err := Read(bad); err == nil || !strings.Contains(err.Error(), bad) {
		t.Errorf("error = %v, want it to name the file", err)
	}
}

func TestLastGeneration(t *testing.T) {
	dir := t.TempDir()
	written := filepath.Join(dir, "nri-state.json")
	if ok, err := Write(written, Doc{Generation: 42}); err != nil || !ok {
		t.Fatal(ok, err)
	}
	broken := filepath.Join(dir, "broken.json")
	if err := os.WriteFile(broken, []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		path    string
		want    int64
		wantErr bool
	}{
		{written, 42, false},
		{filepath.Join(dir, "none.json"), 0, false}, // first start on the node
		{broken, 0, true},
	}
	for _, tc := range cases {
		got, err := LastGeneration(tc.path)
		if got != tc.want || (err != nil) != tc.wantErr {
			t.Errorf("%s: %d, %v; want %d, error %v", filepath.Base(tc.path), got, err, tc.want, tc.wantErr)
		}
	}
}

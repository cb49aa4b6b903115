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
	if err := Write(path, in); err != nil {
		t.Fatal(err)
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
	if err := Write(path, nil); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(path)
	if !strings.Contains(string(data), `"assignments": []`) {
		t.Errorf("empty state is not an empty list: %s", data)
	}
	if entries, _ := os.ReadDir(filepath.Dir(path)); len(entries) != 1 {
		t.Errorf("temporary files left: %v", entries)
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

package chart

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// The chart README's values table is generated from values.yaml (its keys, defaults and the
// comments above them), so it cannot drift from the chart: this test fails when it differs,
// and UPDATE_GOLDEN=1 writes it.
func TestChartREADMEValuesTableIsGenerated(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(root(), "charts", "nvdomain", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	table, err := valuesTable(raw)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(root(), "charts", "nvdomain", "README.md")
	readme, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "<!-- values:begin (generated from values.yaml: UPDATE_GOLDEN=1 go test ./test/chart) -->\n", "<!-- values:end -->"
	s := string(readme)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		t.Fatalf("%s has no %q ... %q section", path, begin, end)
	}
	want := s[:i+len(begin)] + table + s[j:]
	if update {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if want != s {
		t.Errorf("the values table in %s is not values.yaml's; run UPDATE_GOLDEN=1 go test ./test/chart", path)
	}
	// Every value is in the table.
	var values map[string]any
	if err := yaml.Unmarshal(raw, &values); err != nil {
		t.Fatal(err)
	}
	for _, key := range leafKeys("", values) {
		if !strings.Contains(table, "| `"+key+"` |") {
			t.Errorf("values table lacks %s", key)
		}
	}
}

// valuesTable renders values.yaml as a Markdown table: one row per value (maps are walked,
// lists and empty maps are values), its default, and the comment above it (or above the
// section it opens, for a section's first row).
func valuesTable(raw []byte) (string, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return "", fmt.Errorf("parse values.yaml: %w", err)
	}
	var b strings.Builder
	b.WriteString("| Key | Default | Description |\n|---|---|---|\n")
	var walk func(prefix string, m *yaml.Node, inherited string) error
	walk = func(prefix string, m *yaml.Node, inherited string) error {
		for i := 0; i+1 < len(m.Content); i += 2 {
			k, v := m.Content[i], m.Content[i+1]
			key := prefix + k.Value
			desc := comment(k.HeadComment)
			if desc == "" {
				desc = comment(k.LineComment + v.LineComment)
			}
			if i == 0 && inherited != "" {
				desc = strings.TrimSpace(inherited + " " + desc)
			}
			var keys []string
			for j := 0; j < len(v.Content); j += 2 {
				keys = append(keys, v.Content[j].Value)
			}
			if v.Kind == yaml.MappingNode && len(v.Content) > 0 && !labelLike(keys) {
				if err := walk(key+".", v, desc); err != nil {
					return err
				}
				continue
			}
			var val any
			if err := v.Decode(&val); err != nil {
				return fmt.Errorf("%s: %w", key, err)
			}
			def, err := json.Marshal(val)
			if err != nil {
				return fmt.Errorf("%s: %w", key, err)
			}
			fmt.Fprintf(&b, "| `%s` | `%s` | %s |\n", key, strings.ReplaceAll(string(def), "|", `\|`), strings.NewReplacer("|", `\|`, "<", "&lt;", ">", "&gt;").Replace(desc))
		}
		return nil
	}
	if len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return "", fmt.Errorf("values.yaml is not a map")
	}
	if err := walk("", doc.Content[0], ""); err != nil {
		return "", err
	}
	return b.String(), nil
}

// labelLike reports whether a map's keys are label or annotation keys (a nodeSelector, say):
// such a map is one value, not a section.
func labelLike(keys []string) bool {
	for _, k := range keys {
		if strings.ContainsAny(k, "/.") {
			return true
		}
	}
	return false
}

// comment joins a YAML comment's lines into one sentence-run.
func comment(c string) string {
	var parts []string
	for _, l := range strings.Split(c, "\n") {
		l = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(l), "#"))
		if l != "" {
			parts = append(parts, l)
		}
	}
	return strings.Join(parts, " ")
}

func leafKeys(prefix string, m map[string]any) []string {
	var out []string
	for k, v := range m {
		if sub, ok := v.(map[string]any); ok && len(sub) > 0 && !labelLike(slices.Collect(maps.Keys(sub))) {
			out = append(out, leafKeys(prefix+k+".", sub)...)
			continue
		}
		out = append(out, prefix+k)
	}
	return out
}

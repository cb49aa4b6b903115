package main

import (
	"strings"
	"testing"
)

func TestSpliceReport(t *testing.T) {
	old := strings.Join([]string{
		"# report",
		"| area | what | nvdomain | baseline | ratio |",
		"|---|---|---|---|---|",
		"| placement | old 1 | a | b | c |",
		"| placement | old 2 | a | b | c |",
		"| admission | kept row | a | b | c |",
		"",
		"## 3. NRI",
		"kept",
		"",
		placementHeading,
		"",
		"old section",
		"",
		"## Reading",
		"kept reading",
		"",
	}, "\n")
	rows := []row{{"placement", "new", "1", "2", "0.50"}}
	section := placementHeading + "\n\nnew section\n\n"
	cases := []struct {
		name    string
		in      string
		want    []string
		notWant []string
		wantErr bool
	}{
		{name: "replaces the placement rows and section, keeps the rest", in: old,
			want:    []string{"| placement | new | 1 | 2 | 0.50 |\n| admission | kept row", "## 3. NRI\nkept", "new section\n\n## Reading\nkept reading"},
			notWant: []string{"old 1", "old 2", "old section"}},
		{name: "a report without a placement section", in: strings.Replace(old, placementHeading, "## 4. Something else", 1), wantErr: true},
		{name: "a report without placement rows", in: strings.ReplaceAll(old, "| placement |", "| other |"), wantErr: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := spliceReport(c.in, rows, section)
			if (err != nil) != c.wantErr {
				t.Fatalf("error %v, want error %v", err, c.wantErr)
			}
			for _, w := range c.want {
				if !strings.Contains(got, w) {
					t.Errorf("missing %q in:\n%s", w, got)
				}
			}
			for _, w := range c.notWant {
				if strings.Contains(got, w) {
					t.Errorf("still has %q in:\n%s", w, got)
				}
			}
		})
	}
}

func TestWithin(t *testing.T) {
	cases := []struct {
		a, b  float64
		ratio string
		met   bool
	}{
		{1.25, 1, "1.25", true},
		{1.26, 1, "1.26", false},
		{0, 0, "0 / 0", true},
		{3, 0, "∞", false},
	}
	for _, c := range cases {
		if r, ok := within(c.a, c.b); r != c.ratio || ok != c.met {
			t.Errorf("within(%v, %v) = %q, %v; want %q, %v", c.a, c.b, r, ok, c.ratio, c.met)
		}
	}
}

package main

import (
	"strings"
	"testing"
)

func TestSpliceSection(t *testing.T) {
	const heading = "## 5. Scale"
	base := strings.Join([]string{
		"# report",
		"",
		"## Summary",
		"",
		"| area | what | nvdomain | baseline | ratio |",
		"|---|---|---|---|---|",
		"| placement | kept | a | b | c |",
		"| admission | kept too | a | b | c |",
		"",
		"## 1. Admission latency",
		"",
		"kept section",
		"",
		"### Sub",
		"",
		"kept sub",
		"",
		"## Reading",
		"kept reading",
		"",
	}, "\n")
	rows := formatRows([]row{{"scale", "new", "1", "2", "0.50"}})
	section := heading + "\n\nnew section\n\n### its table\n\nrows\n\n"

	// Absent: the rows go at the end of the summary, the section before the reading.
	got, err := spliceSection(base, "| scale |", rows, heading, section)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| admission | kept too | a | b | c |\n| scale | new | 1 | 2 | 0.50 |\n\n## 1.", "kept sub\n\n## 5. Scale\n\nnew section\n\n### its table\n\nrows\n\n## Reading\nkept reading"} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in\n%s", want, got)
		}
	}
	// Present: replaced in place, subsections included, nothing else touched.
	again, err := spliceSection(got, "| scale |", formatRows([]row{{"scale", "newer", "3", "4", "0.75"}}), heading, heading+"\n\nnewer\n\n")
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Replace(strings.Replace(got, "| scale | new | 1 | 2 | 0.50 |", "| scale | newer | 3 | 4 | 0.75 |", 1), "## 5. Scale\n\nnew section\n\n### its table\n\nrows\n\n", "## 5. Scale\n\nnewer\n\n", 1)
	if again != want {
		t.Errorf("replaced\n%s\nwant\n%s", again, want)
	}
	// A subsection is replaced up to the next heading of its level or above.
	sub, err := spliceSection(base, "| admission | kept too", formatRows([]row{{"admission", "kept too, new", "x", "y", "z"}}), "### Sub", "### Sub\n\nnew sub\n\n")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(sub, "kept section\n\n### Sub\n\nnew sub\n\n## Reading") || !strings.Contains(sub, "| admission | kept too, new | x | y | z |\n\n") || strings.Contains(sub, "kept sub") {
		t.Errorf("subsection splice:\n%s", sub)
	}
	// What extractSection takes out, spliceSection puts back unchanged.
	sec, got2 := extractSection(again, "| scale |", heading)
	if sec != heading+"\n\nnewer\n\n" || len(got2) != 1 {
		t.Fatalf("extracted %q %q", sec, got2)
	}
	back, err := spliceSection(base, "| scale |", got2, heading, sec)
	if err != nil || back != again {
		t.Errorf("round trip %v:\n%s\nwant\n%s", err, back, again)
	}
	if _, err := spliceSection("# no summary\n", "| scale |", rows, heading, section); err == nil {
		t.Error("rows without a summary table must be refused")
	}
}

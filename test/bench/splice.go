package main

import (
	"fmt"
	"strings"
)

// formatRows writes summary rows as lines of the report's summary table.
func formatRows(rows []row) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = fmt.Sprintf("| %s | %s | %s | %s | %s |\n", r.area, r.what, r.value, r.baseline, r.ratio)
	}
	return out
}

// headingLevel is the number of #s of a markdown heading line, 0 for another line.
func headingLevel(l string) int {
	i := strings.Index(l, " ")
	if i < 1 || strings.Trim(l[:i], "#") != "" {
		return 0
	}
	return i
}

// spliceSection replaces, in a report, the summary rows whose line starts with rowPrefix by
// rows, and the section that starts with the line heading by section, leaving everything
// else as it is. Rows missing from the report go at the end of the summary table; a missing
// section goes before "## Reading" (or at the end). A section runs to the next heading of
// its level or above. `-only scale` and `-only admission` update the report this way, and the
// full run carries the scale section over, since it does not run it.
func spliceSection(doc, rowPrefix string, rows []string, heading, section string) (string, error) {
	level := headingLevel(heading)
	if level < 2 {
		return "", fmt.Errorf("%q is not a markdown heading of level 2 or more", heading)
	}
	lines := strings.SplitAfter(doc, "\n")
	hasRows := false
	for _, l := range lines {
		hasRows = hasRows || strings.HasPrefix(l, rowPrefix)
	}
	var out strings.Builder
	wroteRows, wroteSection, inSection, inSummary, prevTable := false, false, false, false, false
	writeRows := func() {
		for _, r := range rows {
			out.WriteString(r)
		}
		wroteRows = true
	}
	for _, l := range lines {
		if inSection {
			if lv := headingLevel(l); lv == 0 || lv > level {
				continue
			}
			inSection = false
		}
		switch strings.TrimRight(l, "\n") {
		case heading:
			out.WriteString(section)
			inSection, wroteSection = true, true
			continue
		case "## Reading":
			if !wroteSection {
				out.WriteString(section)
				wroteSection = true
			}
		case "## Summary":
			inSummary = true
		}
		if hasRows && strings.HasPrefix(l, rowPrefix) {
			if !wroteRows {
				writeRows()
			}
			prevTable = true
			continue
		}
		if inSummary && !hasRows && !wroteRows && prevTable && !strings.HasPrefix(l, "|") {
			writeRows()
			inSummary = false
		}
		out.WriteString(l)
		prevTable = strings.HasPrefix(l, "|")
	}
	if !wroteSection {
		if !strings.HasSuffix(out.String(), "\n\n") {
			out.WriteString("\n")
		}
		out.WriteString(section)
	}
	if len(rows) > 0 && !wroteRows {
		return "", fmt.Errorf("the report has no summary table to add the %q rows to; run the whole of `make bench` once", strings.TrimSpace(rowPrefix))
	}
	return out.String(), nil
}

// extractSection returns a report's section under heading (to the next heading of its level
// or above) and its summary rows starting with rowPrefix; "" and nil when absent.
func extractSection(doc, rowPrefix, heading string) (string, []string) {
	level := headingLevel(heading)
	var sec strings.Builder
	var rows []string
	in := false
	for _, l := range strings.SplitAfter(doc, "\n") {
		if in {
			if lv := headingLevel(l); lv == 0 || lv > level {
				sec.WriteString(l)
				continue
			}
			in = false
		}
		if strings.TrimRight(l, "\n") == heading {
			in = true
			sec.WriteString(l)
			continue
		}
		if strings.HasPrefix(l, rowPrefix) {
			rows = append(rows, l)
		}
	}
	return sec.String(), rows
}

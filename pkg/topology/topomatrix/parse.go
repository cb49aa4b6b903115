// Package topomatrix reads the text of `nvidia-smi topo -m` into a topology. It is the
// discovery source for nodes where NVML cannot be called (a support bundle, a node reached
// only through a terminal) and the quickest way for an operator to ask "what domains would
// nvdomain see on this box?".
//
// Real output is messy, and pasted output messier: tab or space separated, NIC columns and
// rows, CPU/NUMA affinity columns that can be empty, a legend or none, CRLF line endings,
// colour codes, shell prompts, copies cut off by a terminal's width or a paste, rows wrapped
// by a narrow terminal or a mail client, blank lines between rows (web pages and chats double
// newlines), Markdown code fences, quote markers, emphasis and tables (| GPU0 | X | NV18 |,
// with their |---| rules). The parser uses what it can read and reports in Topology.Warnings
// what it could not; with Options.Strict any gap is an error instead. A GPU pair counts as
// linked only when one of its two cells reads NV# and the other does not contradict it: a pair
// whose cells are both missing or unreadable counts as not linked, so a domain is only ever a
// set of GPUs whose links were all seen.
package topomatrix

import (
	"bytes"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/topology"
)

// MaxInputBytes bounds what Parse reads; real output is a few kilobytes even on 16-GPU boxes.
const MaxInputBytes = 1 << 20

// MaxGPUs bounds the matrix size so hostile input cannot make the parser quadratic in memory.
const MaxGPUs = 256

// Options tune Parse.
type Options struct {
	// Strict turns every gap (a missing row or cell, an unreadable cell, two cells of one
	// pair that disagree) into an error instead of a warning. The node agent parses strictly:
	// it must never publish a topology it only half saw.
	Strict bool
}

// Parse reads `nvidia-smi topo -m` output.
func Parse(r io.Reader, opts Options) (*topology.Topology, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxInputBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read topo matrix: %w", err)
	}
	if len(data) > MaxInputBytes {
		return nil, fmt.Errorf("topo matrix: input is larger than %d bytes; is this really `nvidia-smi topo -m` output?", MaxInputBytes)
	}
	return ParseBytes(data, opts)
}

var (
	// ansiEscape matches CSI sequences (colours, cursor moves), OSC sequences and two-byte
	// escapes, which terminals and `script` captures leave around the header.
	ansiEscape = regexp.MustCompile(`\x1b(\[[0-9;?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)?|[@-Z\\-_])`)
	gpuName    = regexp.MustCompile(`^GPU(\d+)$`)
	nvCell     = regexp.MustCompile(`^NV(\d+)$`)
)

// pcieCells are the non-NVLink connection kinds nvidia-smi prints (SOC and PSB come from
// older drivers).
var pcieCells = map[string]bool{"SYS": true, "NODE": true, "PHB": true, "PXB": true, "PIX": true, "SOC": true, "PSB": true}

type cellKind int

const (
	cellUnknown cellKind = iota
	cellSelf
	cellNVLink
	cellPCIe
)

func classify(cell string) cellKind {
	switch {
	case cell == "X":
		return cellSelf
	case nvCell.MatchString(cell):
		return cellNVLink
	case pcieCells[cell]:
		return cellPCIe
	}
	return cellUnknown
}

type affinityColumn int

const (
	colCPUAffinity affinityColumn = iota
	colNUMAAffinity
	colGPUNUMAID
)

type matrix struct {
	devCols  []string         // device column names, in header order
	affCols  []affinityColumn // affinity columns after the devices
	rows     map[string][]string
	rowOrder []string
}

// ParseBytes is Parse over a byte slice.
func ParseBytes(data []byte, opts Options) (*topology.Topology, error) {
	m, err := readMatrix(toLines(normalize(data)))
	if err != nil {
		return nil, err
	}
	return m.topology(opts)
}

func normalize(data []byte) []string {
	data = ansiEscape.ReplaceAll(data, nil)
	data = bytes.ReplaceAll(data, []byte("\r\n"), []byte("\n"))
	data = bytes.ReplaceAll(data, []byte("\r"), []byte("\n"))
	data = bytes.Map(func(r rune) rune {
		if r == '\t' || r == '\n' || r >= ' ' {
			return r
		}
		return -1
	}, data)
	return strings.Split(string(data), "\n")
}

// line is one physical input line: how wide a terminal drew it, and the words it holds once
// the decoration people add when pasting (Markdown fences, table pipes and rules, emphasis,
// quote markers) is taken off.
type line struct {
	raw   string
	width int
	words []string
}

func (l line) blank() bool { return len(l.words) == 0 }

// endsInWord and startsInWord tell whether a terminal wrap at this boundary could have cut a
// word in two: only then are the two halves glued back together.
func (l line) endsInWord() bool {
	r, _ := utf8.DecodeLastRuneInString(l.raw)
	return l.raw != "" && !unicode.IsSpace(r) && r != '|'
}

func (l line) startsInWord() bool {
	r, _ := utf8.DecodeRuneInString(l.raw)
	return l.raw != "" && !unicode.IsSpace(r) && r != '|' && r != '>'
}

func toLines(raw []string) []line {
	out := make([]line, len(raw))
	for i, r := range raw {
		out[i] = line{raw: r, width: displayWidth(r), words: words(r)}
	}
	return out
}

// displayWidth is the number of terminal columns the line took, with tabs at 8-column stops:
// that is the width at which a terminal wraps, whatever the copy turned the tabs into.
func displayWidth(s string) int {
	w := 0
	for _, r := range s {
		if r == '\t' {
			w += 8 - w%8
			continue
		}
		w++
	}
	return w
}

// tableRule matches Markdown and reStructuredText table rules (|---|:--:|, +----+----+).
var tableRule = regexp.MustCompile(`^[|+:\-= \t]*[-=][|+:\-= \t]*$`)

// words splits a line into the matrix's words. Pipes separate words like whitespace does, so
// a Markdown table row reads like the plain row it was made from; a code fence or a table rule
// has no words, like a blank line.
func words(s string) []string {
	t := strings.TrimSpace(s)
	for strings.HasPrefix(t, ">") {
		t = strings.TrimSpace(t[1:])
	}
	if strings.HasPrefix(t, "```") || strings.HasPrefix(t, "~~~") || tableRule.MatchString(t) {
		return nil
	}
	var out []string
	for _, w := range strings.FieldsFunc(t, func(r rune) bool { return unicode.IsSpace(r) || r == '|' }) {
		// **NV4**, `X` and _SYS_: emphasis someone added to make a link stand out.
		if w = strings.Trim(w, "*_`"); w != "" {
			out = append(out, w)
		}
	}
	return out
}

// wrapWidth guesses the width of the terminal that wrapped the output: the longest line, when
// at least two lines are exactly that long. Unwrapped output usually also has several lines of
// equal greatest length (the GPU rows), which is harmless: a line is only treated as wrapped
// when the line after it cannot stand on its own.
func wrapWidth(lines []line) int {
	longest, count := 0, 0
	for _, l := range lines {
		switch {
		case l.width > longest:
			longest, count = l.width, 1
		case l.width == longest:
			count++
		}
	}
	if count < 2 || longest < 16 {
		return 0
	}
	return longest
}

// joinWrapped appends a continuation line's words to a row or header. A break between two
// characters of one word is glued back ("NV1" + "8"), a break between words is not. Which one
// happened is read from the words when they tell ("NIC7" + "NIC8" are two columns, "N" + "IC7"
// is one); when both readings make sense, from the width: a terminal cuts a word only where
// the line filled it exactly. valid says whether a word can stand at a position of acc.
func joinWrapped(acc []string, prev, next line, width int, valid func(w string, pos int) bool) []string {
	if len(acc) == 0 || !prev.endsInWord() || !next.startsInWord() {
		return append(acc, next.words...)
	}
	p := len(acc) - 1
	a, b := acc[p], next.words[0]
	va, vb, vg := valid(a, p), valid(b, p+1), valid(a+b, p)
	glue := width > 0 && prev.width == width
	switch {
	case vg && !(va && vb):
		glue = true
	case va && vb && !vg:
		glue = false
	}
	if !glue {
		return append(acc, next.words...)
	}
	acc = slices.Clone(acc)
	acc[p] = a + b
	return append(acc, next.words[1:]...)
}

// deviceName matches the device columns nvidia-smi prints: GPU3, NIC10, mlx5_0, mlx5_bond_0.
var deviceName = regexp.MustCompile(`^[A-Za-z]+[0-9]*(_[A-Za-z0-9]+)*[0-9]$`)

// affinityHeading holds the words of the headings after the device columns.
var affinityHeading = map[string]bool{"CPU": true, "NUMA": true, "Affinity": true, "GPU": true, "ID": true}

func validHeaderWord(w string, _ int) bool { return deviceName.MatchString(w) || affinityHeading[w] }

// validRowWord says whether w can stand at position pos of a row's cells: a link kind among
// the device columns, a link kind or an affinity value after them.
func (m *matrix) validRowWord(w string, pos int) bool {
	if pos < len(m.devCols) {
		return classify(w) != cellUnknown
	}
	return cellOrAffinity(w)
}

// cpuList matches the CPU and NUMA affinity values nvidia-smi prints: "0-47,96-143", "3", or
// GB200's multi-range NUMA lists.
var cpuList = regexp.MustCompile(`^[0-9][0-9,\-]*$`)

// cellOrAffinity reports whether a word can appear in a matrix row after the row name.
func cellOrAffinity(w string) bool {
	return classify(w) != cellUnknown || cpuList.MatchString(w) || w == "N/A"
}

func isHeader(ws []string) bool {
	return len(ws) > 0 && ws[0] == "GPU0" && !slices.Contains(ws, "X")
}

func readMatrix(lines []line) (*matrix, error) {
	header := slices.IndexFunc(lines, func(l line) bool { return isHeader(l.words) })
	if header < 0 {
		return nil, fmt.Errorf("topo matrix: no header line found (a line starting with GPU0, as `nvidia-smi topo -m` prints); pass the command's whole output")
	}
	width := wrapWidth(lines[header:])

	// The header ends at the first line holding a cell: a wrapped header continues on lines
	// that hold only column names, which may be GPUs ("GPU9 GPU10 ... CPU Affinity").
	hdr := slices.Clone(lines[header].words)
	prev := lines[header]
	i := header + 1
	// blankSeparated: the paste puts blank lines between the lines of the matrix, so a blank
	// line no longer ends a row.
	gap, blankSeparated := false, false
	for ; i < len(lines); i++ {
		l := lines[i]
		if l.blank() {
			gap = true
			continue
		}
		if first := l.words[0]; slices.ContainsFunc(l.words, func(w string) bool { return classify(w) != cellUnknown }) ||
			gpuName.MatchString(first) && slices.Contains(hdr, first) {
			break
		}
		hdr = joinWrapped(hdr, prev, l, width, validHeaderWord)
		blankSeparated = blankSeparated || gap
		prev, gap = l, false
	}

	m := &matrix{rows: map[string][]string{}}
	m.parseHeader(hdr)
	if dup := firstDuplicate(m.devCols); dup != "" {
		return nil, fmt.Errorf("topo matrix: header names column %s twice", dup)
	}
	isDevice := map[string]bool{}
	for _, c := range m.devCols {
		isDevice[c] = true
	}

	// Rows. Blank lines between rows are skipped (pastes from web pages and chats double every
	// newline). A line that does not start a row either continues the row above (the terminal
	// wrapped it) or ends the matrix (the legend, a prompt, the next command).
	var cur string
	for ; i < len(lines); i++ {
		l := lines[i]
		if l.blank() {
			gap = true
			continue
		}
		name := l.words[0]
		switch {
		case isHeader(l.words) && len(l.words) > 1:
			// A second matrix (another node, or `topo -p2p`): only the first is read.
			return m, nil
		case isDevice[name] || gpuName.MatchString(name):
			if _, dup := m.rows[name]; dup {
				return nil, fmt.Errorf("topo matrix: row %s appears twice", name)
			}
			blankSeparated = blankSeparated || gap
			cur = name
			m.rows[name] = l.words[1:]
			m.rowOrder = append(m.rowOrder, name)
		case cur != "" && m.continues(l, prev, gap && !blankSeparated, width):
			m.rows[cur] = joinWrapped(m.rows[cur], prev, l, width, m.validRowWord)
		default:
			return m, nil
		}
		prev, gap = l, false
	}
	return m, nil
}

// continues decides whether l is the rest of the row above it. A row ends at a blank line
// unless the paste separates every row by one; otherwise a line continues the row when the
// line above filled the terminal exactly (a hard wrap), or when every word in it is a cell or
// an affinity value (a wrap at a word boundary, as mail clients and chat windows do).
func (m *matrix) continues(l, prev line, afterGap bool, width int) bool {
	if afterGap {
		return false
	}
	if width > 0 && prev.width == width {
		return true
	}
	return !slices.ContainsFunc(l.words, func(w string) bool { return !cellOrAffinity(w) })
}

// parseHeader splits the header words into device columns and the affinity columns after them.
func (m *matrix) parseHeader(words []string) {
	i := 0
	for ; i < len(words); i++ {
		w := words[i]
		if w == "CPU" || w == "NUMA" || w == "GPU" {
			break
		}
		// Some environment reports (vLLM's collect_env) pad columns to a fixed width and glue
		// the last device to the next heading: "NIC11CPU Affinity".
		if next := i + 1; next < len(words) && words[next] == "Affinity" {
			if dev, ok := strings.CutSuffix(w, "CPU"); ok && dev != "" {
				m.devCols = append(m.devCols, dev)
				words = slices.Insert(slices.Clone(words), next, "CPU")
				i++
				break
			}
		}
		m.devCols = append(m.devCols, w)
	}
	for ; i < len(words); i++ {
		switch words[i] {
		case "CPU":
			m.affCols = append(m.affCols, colCPUAffinity)
		case "NUMA":
			m.affCols = append(m.affCols, colNUMAAffinity)
		case "GPU":
			m.affCols = append(m.affCols, colGPUNUMAID)
			i += 2 // "NUMA ID"
		}
	}
}

func firstDuplicate(s []string) string {
	seen := map[string]bool{}
	for _, v := range s {
		if seen[v] {
			return v
		}
		seen[v] = true
	}
	return ""
}

// cell returns row's cell in device column col, or "" when the row or the column is missing.
func (m *matrix) cell(row string, col int) string {
	cells, ok := m.rows[row]
	if !ok || col >= len(cells) || col >= len(m.devCols) {
		return ""
	}
	return cells[col]
}

func (m *matrix) topology(opts Options) (*topology.Topology, error) {
	// GPUs are whatever the header or the rows name; either may have been cut.
	colOf := map[int]int{}
	idxSet := map[int]bool{}
	for c, name := range m.devCols {
		if g, ok := gpuIndex(name); ok {
			colOf[g] = c
			idxSet[g] = true
		}
	}
	for _, name := range m.rowOrder {
		if g, ok := gpuIndex(name); ok {
			idxSet[g] = true
		}
	}
	if len(idxSet) == 0 {
		return nil, fmt.Errorf("topo matrix: no GPU found in the header or the rows")
	}
	if len(idxSet) > MaxGPUs {
		return nil, fmt.Errorf("topo matrix: %d GPUs is more than the %d this parser accepts", len(idxSet), MaxGPUs)
	}
	idx := slices.Sorted(func(yield func(int) bool) {
		for g := range idxSet {
			if !yield(g) {
				return
			}
		}
	})

	var problems []string
	// A GPU row must have X in its own column; anything else means its cells are shifted
	// against the header, and reading them would invent links.
	for _, g := range idx {
		row := "GPU" + strconv.Itoa(g)
		if c, ok := colOf[g]; ok {
			if v := m.cell(row, c); v != "" && v != "X" {
				return nil, fmt.Errorf("topo matrix: row %s has %q in its own column where X belongs; the row's cells do not line up with the header", row, v)
			}
		}
	}

	links := topology.NewLinks()
	var unknown, unreadable []string
	for a := 0; a < len(idx); a++ {
		for b := a + 1; b < len(idx); b++ {
			ga, gb := idx[a], idx[b]
			ab := m.pairCell(ga, gb, colOf)
			ba := m.pairCell(gb, ga, colOf)
			ka, kb := classify(ab), classify(ba)
			for _, c := range []struct {
				from, to int
				cell     string
				kind     cellKind
			}{{ga, gb, ab, ka}, {gb, ga, ba, kb}} {
				if c.kind == cellUnknown && c.cell != "" {
					unreadable = append(unreadable, fmt.Sprintf("GPU%d→GPU%d %q", c.from, c.to, c.cell))
				}
			}
			switch {
			case ka == cellUnknown && kb == cellUnknown:
				unknown = append(unknown, fmt.Sprintf("%d-%d", ga, gb))
			case ka != cellUnknown && kb != cellUnknown && (ka == cellNVLink) != (kb == cellNVLink):
				problems = append(problems, fmt.Sprintf("GPU%d→GPU%d says %s but GPU%d→GPU%d says %s; treated as not linked", ga, gb, ab, gb, ga, ba))
			case ka == cellNVLink || kb == cellNVLink:
				links.Add(ga, gb)
			}
		}
	}
	var missingRows []string
	for _, g := range idx {
		if _, ok := m.rows["GPU"+strconv.Itoa(g)]; !ok {
			missingRows = append(missingRows, "GPU"+strconv.Itoa(g))
		}
	}
	if len(missingRows) > 0 {
		problems = append(problems, "no row for "+strings.Join(missingRows, ", ")+" (output cut short?)")
	}
	if len(unknown) > 0 {
		problems = append(problems, fmt.Sprintf("link unknown for %d GPU pair(s): %s; those pairs count as not linked", len(unknown), listSome(unknown, 12)))
	}
	if len(unreadable) > 0 {
		problems = append(problems, fmt.Sprintf("%d cell(s) are not a link kind nvidia-smi prints: %s; each counts as missing, so its pair is linked only if the other cell of the pair says NV#", len(unreadable), listSome(unreadable, 6)))
	}
	if opts.Strict && len(problems) > 0 {
		return nil, fmt.Errorf("topo matrix is incomplete: %s", strings.Join(problems, "; "))
	}

	gpus := make([]topology.GPU, 0, len(idx))
	for _, g := range idx {
		gpus = append(gpus, m.gpuDetails(g))
	}
	return topology.New(names.SourceTopoMatrix, gpus, links, problems)
}

// pairCell is row a's cell in GPU b's column.
func (m *matrix) pairCell(a, b int, colOf map[int]int) string {
	c, ok := colOf[b]
	if !ok {
		return ""
	}
	return m.cell("GPU"+strconv.Itoa(a), c)
}

func (m *matrix) gpuDetails(g int) topology.GPU {
	gpu := topology.GPU{Index: g}
	cells := m.rows["GPU"+strconv.Itoa(g)]
	if len(cells) <= len(m.devCols) {
		return gpu
	}
	// Empty affinity fields vanish when splitting on whitespace, so values are matched to
	// columns in order; a missing trailing value is simply unknown. Link cells left over past
	// the device columns mean the header lost a column (vLLM's reports glue "NIC11NIC12"), so
	// they are skipped rather than read as affinities.
	tail := cells[len(m.devCols):]
	for len(tail) > 0 && classify(tail[0]) != cellUnknown {
		tail = tail[1:]
	}
	for i, v := range tail {
		if i >= len(m.affCols) {
			break
		}
		switch m.affCols[i] {
		case colCPUAffinity:
			if v != "N/A" {
				gpu.CPUAffinity = v
			}
		case colNUMAAffinity:
			if n, err := strconv.Atoi(v); err == nil && n >= 0 {
				gpu.NUMANode = &n
			}
		}
	}
	return gpu
}

func gpuIndex(name string) (int, bool) {
	s := gpuName.FindStringSubmatch(name)
	if s == nil {
		return 0, false
	}
	n, err := strconv.Atoi(s[1])
	if err != nil || n > 1<<20 {
		return 0, false
	}
	return n, true
}

func listSome(items []string, limit int) string {
	if len(items) <= limit {
		return strings.Join(items, ", ")
	}
	return strings.Join(items[:limit], ", ") + fmt.Sprintf(" and %d more", len(items)-limit)
}

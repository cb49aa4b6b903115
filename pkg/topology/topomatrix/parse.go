// Package topomatrix reads the text of `nvidia-smi topo -m` into a topology. It is the
// discovery source for nodes where NVML cannot be called (a support bundle, a node reached
// only through a terminal) and the quickest way for an operator to ask "what domains would
// nvdomain see on this box?".
//
// Real output is messy: tab or space separated, NIC columns and rows, CPU/NUMA affinity
// columns that can be empty, a legend, CRLF line endings, colour codes, and copies cut off by
// a terminal's width or a paste. The parser uses what it can read and reports in
// Topology.Warnings what it could not; with Options.Strict any gap is an error instead. A GPU
// pair whose cell is missing counts as not linked, so a domain is only ever a set of GPUs
// whose links were all seen.
package topomatrix

import (
	"bytes"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"

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
	m, err := readMatrix(normalize(data))
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

func readMatrix(lines []string) (*matrix, error) {
	header := -1
	for i, l := range lines {
		f := strings.Fields(l)
		if len(f) > 0 && f[0] == "GPU0" && !slices.Contains(f, "X") {
			header = i
			break
		}
	}
	if header < 0 {
		return nil, fmt.Errorf("topo matrix: no header line found (a line starting with GPU0, as `nvidia-smi topo -m` prints); pass the command's whole output")
	}
	m := &matrix{rows: map[string][]string{}}
	words := strings.Fields(lines[header])
	i := 0
	for ; i < len(words); i++ {
		if w := words[i]; w == "CPU" || w == "NUMA" || w == "GPU" {
			break
		}
		m.devCols = append(m.devCols, words[i])
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
	if dup := firstDuplicate(m.devCols); dup != "" {
		return nil, fmt.Errorf("topo matrix: header names column %s twice", dup)
	}
	isDevice := map[string]bool{}
	for _, c := range m.devCols {
		isDevice[c] = true
	}
	for _, l := range lines[header+1:] {
		f := strings.Fields(l)
		if len(f) == 0 {
			if len(m.rowOrder) > 0 {
				break // the blank line before the legend
			}
			continue
		}
		name := f[0]
		if !isDevice[name] && !gpuName.MatchString(name) {
			break // legend, prompt, or whatever followed the matrix
		}
		if _, dup := m.rows[name]; dup {
			return nil, fmt.Errorf("topo matrix: row %s appears twice", name)
		}
		m.rows[name] = f[1:]
		m.rowOrder = append(m.rowOrder, name)
	}
	return m, nil
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
	var unknown []string
	for a := 0; a < len(idx); a++ {
		for b := a + 1; b < len(idx); b++ {
			ga, gb := idx[a], idx[b]
			ab := m.pairCell(ga, gb, colOf)
			ba := m.pairCell(gb, ga, colOf)
			ka, kb := classify(ab), classify(ba)
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
	// columns in order; a missing trailing value is simply unknown.
	for i, v := range cells[len(m.devCols):] {
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

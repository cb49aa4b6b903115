// Package checkconfig checks a node dump (`kubectl get nodes -o json`) for GPU nodes whose
// configuration and advertised GPU resources disagree, without cluster access. Such a node has
// idle GPUs while pods that ask for them sit Pending with "Insufficient nvidia.com/gpu".
//
// Four checks, each applying to the nodes that carry its label:
//   - nvidia.com/gpu.workload.config (GPU Operator's workload mode) decides which NVIDIA
//     component runs on the node and so under which resource name its GPUs appear;
//   - nvidia.com/mig.config.state is mig-manager's report: failed is a mismatch, and so is
//     pending or rebooting for longer than Options.PendingTimeout;
//   - nvidia.com/mig.config names a mig-parted layout; given the config file
//     (Options.MIGConfig), the node must advertise exactly what that layout makes of its
//     nvidia.com/gpu.count GPUs under its nvidia.com/mig.strategy;
//   - nvidia.com/gpu.replicas above 1 is time-slicing: each device is advertised that many
//     times, as nvidia.com/gpu or, renamed, nvidia.com/gpu.shared.
//
// A node counts as checked (the n of OK=n) when at least one of these labels is on it.
package checkconfig

import (
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nvdomain/nvdomain/pkg/names"
)

// Kind is the family a GPU resource name belongs to.
type Kind string

// The three families, named after the workload mode that produces them.
const (
	KindContainer     Kind = names.WorkloadContainer
	KindVMPassthrough Kind = names.WorkloadVMPassthrough
	KindVMVGPU        Kind = names.WorkloadVMVGPU
)

// vgpuProfile matches vGPU type names such as NVIDIA_A10-12Q or GRID_T4-16C: a framebuffer
// size in GB and one capital letter for the profile series.
var vgpuProfile = regexp.MustCompile(`-[0-9]+[A-Z]$`)

// Classify returns the family of an nvidia.com/ resource, and false for resources that are not
// GPU devices (nvdomain's own per-domain counters, for one).
//
// container covers what the device plugin advertises in container mode: nvidia.com/gpu, the
// time-sliced nvidia.com/gpu.shared and MIG profiles (nvidia.com/mig-1g.5gb, also .shared).
// vm-vgpu is a vGPU profile name; vm-passthrough is any other device name (the sandbox device
// plugin advertises the PCI device model, e.g. nvidia.com/GA102GL_A10).
func Classify(resource string, n names.Names) (Kind, bool) {
	rest, ok := strings.CutPrefix(resource, names.NVIDIAPrefix)
	if !ok || rest == "" || n.IsDomainResource(resource) {
		return "", false
	}
	switch {
	case resource == names.GPUResource, resource == names.SharedGPUResource, strings.HasPrefix(resource, names.MIGResourcePrefix):
		return KindContainer, true
	case vgpuProfile.MatchString(rest):
		return KindVMVGPU, true
	}
	return KindVMPassthrough, true
}

// Result is the outcome for one checked node.
type Result struct {
	Node   string
	Reason string
}

// Report is the outcome of a check.
type Report struct {
	// Nodes is every node in the dump; Checked those carrying a label the checks read.
	Nodes      int
	Checked    int
	Mismatches []Result
}

// NothingChecked reports a dump in which no node carries a label the checks read: a dump of
// the wrong cluster, or of one whose GPU Operator has not labelled its nodes. OK=0 would read
// as a pass.
func (r *Report) NothingChecked() bool { return r.Checked == 0 && len(r.Mismatches) == 0 }

// node is the part of a v1.Node the check reads; decoding only this keeps the checker usable
// on dumps from any Kubernetes version.
type node struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name          string            `json:"name"`
		Labels        map[string]string `json:"labels"`
		ManagedFields []managedField    `json:"managedFields"`
	} `json:"metadata"`
	Status struct {
		Capacity    map[string]string `json:"capacity"`
		Allocatable map[string]string `json:"allocatable"`
	} `json:"status"`
}

// managedField is one field manager's entry: when it last wrote the object and which fields
// it owns. `kubectl get -o json` leaves these out unless given --show-managed-fields.
type managedField struct {
	Manager  string         `json:"manager"`
	Time     string         `json:"time"`
	FieldsV1 map[string]any `json:"fieldsV1"`
}

// PendingPolicy says what a pending MIG state whose age cannot be read counts as.
type PendingPolicy string

// The values of --mig-pending-no-timestamp.
const (
	PendingOK       PendingPolicy = "ok"
	PendingMismatch PendingPolicy = "mismatch"
)

// Options tune Check. The zero value runs the workload, MIG state (failed only) and
// time-slicing checks.
type Options struct {
	// MIGConfig is the mig-parted config nodes' nvidia.com/mig.config labels name; nil skips
	// the MIG resource check (the state is still checked).
	MIGConfig *MIGConfig
	// MIGConfigSource names MIGConfig's file in messages.
	MIGConfigSource string
	// PendingTimeout is how long nvidia.com/mig.config.state may stay pending or rebooting;
	// 0 turns the age check off. The age is read from the node's managedFields (see
	// node.stateSince).
	PendingTimeout time.Duration
	// PendingWithoutTime is what a pending or rebooting state counts as when the dump does
	// not say since when; the zero value is PendingOK.
	PendingWithoutTime PendingPolicy
	// Now is the time the dump is judged at; zero means time.Now().
	Now time.Time
}

type checker struct {
	n    names.Names
	opts Options
	now  time.Time
}

type list struct {
	Kind  string `json:"kind"`
	Items []node `json:"items"`
}

// Check reads a `kubectl get nodes -o json` dump (a List or NodeList, or a single Node) and
// checks every node that carries one of the labels in the package comment. Nodes with none
// are skipped and not counted.
func Check(r io.Reader, n names.Names, opts Options) (*Report, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("read node dump: %w", err)
	}
	var l list
	if err := json.Unmarshal(data, &l); err != nil {
		return nil, fmt.Errorf("node dump is not valid JSON: %w; produce it with `kubectl get nodes -o json`", err)
	}
	nodes := l.Items
	switch l.Kind {
	case "List", "NodeList":
	case "Node":
		var one node
		if err := json.Unmarshal(data, &one); err != nil {
			return nil, fmt.Errorf("node dump: %w", err)
		}
		nodes = []node{one}
	default:
		return nil, fmt.Errorf("node dump has kind %q; expected the List that `kubectl get nodes -o json` prints", l.Kind)
	}
	switch opts.PendingWithoutTime {
	case "", PendingOK, PendingMismatch:
	default:
		return nil, fmt.Errorf("pending policy %q: use %s or %s", opts.PendingWithoutTime, PendingOK, PendingMismatch)
	}
	c := &checker{n: n, opts: opts, now: opts.Now}
	if c.now.IsZero() {
		c.now = time.Now()
	}
	rep := &Report{Nodes: len(nodes)}
	for i, nd := range nodes {
		reasons, checked := c.checkNode(nd)
		if !checked {
			continue
		}
		name := nd.Metadata.Name
		if name == "" {
			name = fmt.Sprintf("items[%d]", i)
		}
		rep.Checked++
		if len(reasons) > 0 {
			rep.Mismatches = append(rep.Mismatches, Result{Node: name, Reason: strings.Join(reasons, "; ")})
		}
	}
	return rep, nil
}

// checkNode runs every check whose label the node carries; checked is false when none does.
func (c *checker) checkNode(nd node) (reasons []string, checked bool) {
	labels := nd.Metadata.Labels
	add := func(r string) {
		if r != "" {
			reasons = append(reasons, r)
		}
	}
	if mode, ok := labels[names.WorkloadConfigLabel]; ok {
		checked = true
		add(checkWorkload(nd, mode, c.n))
	}
	_, hasState := labels[names.MIGConfigStateLabel]
	cfgName, hasMIG := labels[names.MIGConfigLabel]
	_, hasReplicas := labels[names.GPUReplicasLabel]
	checked = checked || hasState || hasMIG || hasReplicas

	stateReason, inFlux := c.migState(nd)
	add(stateReason)
	replicas, replicasReason := nd.replicas()
	add(replicasReason)
	switch {
	case inFlux:
		// mig-manager is changing the layout (or failed to): the resources are in between and
		// say nothing about the config; the state check above speaks for the node.
	case hasMIG && c.opts.MIGConfig != nil:
		add(c.checkMIG(nd, cfgName, replicas))
	case hasMIG:
		// Without the config file the layout, and so the count time-slicing multiplies, is
		// unknown.
	case replicas > 1:
		add(checkTimeSlicing(nd, replicas))
	}
	return reasons, checked
}

func checkWorkload(nd node, mode string, n names.Names) string {
	want := Kind(mode)
	if want != KindContainer && want != KindVMPassthrough && want != KindVMVGPU {
		return fmt.Sprintf("label %s=%q is not a workload mode; use container, vm-passthrough or vm-vgpu", names.WorkloadConfigLabel, mode)
	}
	byKind := map[Kind][]string{}
	for _, m := range []map[string]string{nd.Status.Capacity, nd.Status.Allocatable} {
		for res, qty := range m {
			kind, ok := Classify(res, n)
			if !ok || isZero(qty) || slices.Contains(byKind[kind], res) {
				continue
			}
			byKind[kind] = append(byKind[kind], res)
		}
	}
	var kinds []Kind
	for k := range byKind {
		kinds = append(kinds, k)
		slices.Sort(byKind[k])
	}
	slices.Sort(kinds)
	expect := map[Kind]string{
		KindContainer:     names.GPUResource,
		KindVMPassthrough: "a device model name such as nvidia.com/GA102GL_A10",
		KindVMVGPU:        "a vGPU profile such as nvidia.com/NVIDIA_A10-12Q",
	}[want]
	switch {
	case len(kinds) == 0:
		return fmt.Sprintf("label %s=%s but the node advertises no NVIDIA GPU resource; expected %s (is the %s component running on this node?)",
			names.WorkloadConfigLabel, mode, expect, component(want))
	case len(kinds) > 1:
		var parts []string
		for _, k := range kinds {
			parts = append(parts, fmt.Sprintf("%s (%s)", strings.Join(byKind[k], ","), k))
		}
		return fmt.Sprintf("label %s=%s but the node advertises more than one kind of GPU resource: %s; one workload mode must own all the node's GPUs",
			names.WorkloadConfigLabel, mode, strings.Join(parts, " and "))
	case kinds[0] != want:
		return fmt.Sprintf("label %s=%s but the node advertises %s, which is what %s mode advertises; expected %s. Fix the label or the resources, or pods sit Pending while GPUs are free",
			names.WorkloadConfigLabel, mode, strings.Join(byKind[kinds[0]], ","), kinds[0], expect)
	}
	return ""
}

func component(k Kind) string {
	switch k {
	case KindVMPassthrough:
		return "sandbox device plugin (vfio-manager)"
	case KindVMVGPU:
		return "vGPU device manager"
	}
	return "NVIDIA device plugin"
}

// isZero reports whether a resource quantity is zero ("0", "0k", "0.0"), which counts as not
// advertised: the kubelet keeps a stale resource at zero after its device plugin goes away.
func isZero(q string) bool {
	q = strings.TrimSpace(q)
	num := strings.TrimRightFunc(q, func(r rune) bool { return (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') })
	v, err := strconv.ParseFloat(num, 64)
	return err == nil && v == 0
}

// Write prints the report in the checker's line format: one MISMATCH=<node> <reason> line per
// bad node, or OK=<nodes checked>, or, when no node was checked, one NONE=<nodes in the dump>
// line saying so.
func (r *Report) Write(w io.Writer) error {
	if r.NothingChecked() {
		_, err := fmt.Fprintf(w, "NONE=%d nodes in the dump, none with %s, %s, %s or %s: nothing was checked; dump the GPU nodes of a cluster whose GPU Operator labels them (kubectl get nodes -o json)\n",
			r.Nodes, names.WorkloadConfigLabel, names.MIGConfigLabel, names.MIGConfigStateLabel, names.GPUReplicasLabel)
		return err
	}
	if len(r.Mismatches) == 0 {
		_, err := fmt.Fprintf(w, "OK=%d\n", r.Checked)
		return err
	}
	for _, m := range r.Mismatches {
		if _, err := fmt.Fprintf(w, "MISMATCH=%s %s\n", m.Node, m.Reason); err != nil {
			return err
		}
	}
	return nil
}

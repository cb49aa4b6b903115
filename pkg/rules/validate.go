package rules

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/nvdomain/nvdomain/pkg/names"
)

// Reasons label rejections in metrics; each Violation carries one.
const (
	ReasonNoGPU          = "no-gpu"
	ReasonTPSize         = "tp-size"
	ReasonNoDomain       = "no-domain-large-enough"
	ReasonEngineMismatch = "engine-flag-mismatch"
	ReasonSharedGPU      = "mig-or-shared-gpu"
	ReasonDomainConflict = "domain-conflict"
	ReasonNotPinned      = "not-pinned"
	ReasonNoClique       = "no-clique-large-enough"
	ReasonNoNodeSelected = "no-node-selected"
)

// Violation is one reason to reject a pod.
type Violation struct {
	Field   string
	Reason  string
	Message string
}

func (v Violation) Error() string { return v.Field + ": " + v.Message }

// Config holds the settings the rules read.
type Config struct {
	Names names.Names
	// AllowedTPSizes are the GPU counts a tensor-parallel pod may ask for, ascending.
	AllowedTPSizes []int
}

// DefaultAllowedTPSizes are the powers of two from 2: TP engines shard attention
// heads evenly, and aligned domain blocks come in powers of two.
var DefaultAllowedTPSizes = []int{2, 4, 8, 16, 32, 64, 128, 256}

// ValidateTP checks a tensor-parallel pod's own spec: a GPU ask, an allowed size, whole GPUs,
// engine flags that agree with the GPU count. It returns nothing for other pods. largest
// returns the largest domain in the cluster (nil or 0 when unknown); the message lists only the
// allowed sizes up to it, since larger ones could not run anyway. It is a function because
// finding it walks the nodes, which only a disallowed size needs.
func ValidateTP(p Pod, cfg Config, largest func() int) []Violation {
	if !p.TP {
		return nil
	}
	var vs []Violation
	for _, c := range p.Containers {
		for name, v := range c.Resources {
			res := string(name)
			if v > 0 && (strings.HasPrefix(res, names.MIGResourcePrefix) || strings.HasSuffix(res, ".shared")) && strings.HasPrefix(res, names.NVIDIAPrefix) {
				kind := "MIG instances"
				if strings.HasSuffix(res, ".shared") {
					kind = "time-sliced GPU replicas"
				}
				vs = append(vs, Violation{c.ResourcePath(res), ReasonSharedGPU,
					fmt.Sprintf("%s have no NVLink between them, so a tensor-parallel pod cannot use them; request whole GPUs with %s, or remove the %s=%s label", kind, names.GPUResource, names.TPLabel, names.TPLabelValue)})
			}
		}
	}
	gpuContainers := p.GPUContainers()
	if p.GPUs == 0 {
		if len(vs) > 0 {
			return vs
		}
		return append(vs, Violation{"spec.containers", ReasonNoGPU,
			fmt.Sprintf("the pod is labelled %s=%s but no container requests %s; add %s: <GPUs> to resources.limits of the container that runs the engine, or remove the label",
				names.TPLabel, names.TPLabelValue, names.GPUResource, names.GPUResource)})
	}
	if !slices.Contains(cfg.AllowedTPSizes, p.GPUs) {
		field := gpuContainers[0].ResourcePath(names.GPUResource)
		size := fmt.Sprintf("tensor-parallel size %d", p.GPUs)
		if len(gpuContainers) > 1 {
			field = "spec.containers[*].resources.limits[" + names.GPUResource + "]"
			size = fmt.Sprintf("tensor-parallel size %d (the sum over %d containers)", p.GPUs, len(gpuContainers))
		}
		vs = append(vs, Violation{field, ReasonTPSize,
			fmt.Sprintf("%s is not allowed (allowed: %s); request one of those GPU counts", size, joinInts(shown(cfg.AllowedTPSizes, largest)))})
	}
	for _, c := range gpuContainers {
		if v, ok := engineMismatch(c, p.Group); ok {
			vs = append(vs, v)
		}
	}
	return vs
}

// ValidateDomains checks the domain resources, annotation and affinity of any pod that holds
// nvdomain domain resources, whether nvdomain or a person wrote them: one domain only, counts
// equal to the GPU counts, and no annotation or affinity naming another domain.
func ValidateDomains(pod *corev1.Pod, p Pod, n names.Names) []Violation {
	var vs []Violation
	d := -1
	var first Container
	for _, c := range p.Containers {
		for _, id := range c.Domains {
			if d < 0 {
				d, first = id, c
				continue
			}
			if id != d {
				vs = append(vs, Violation{c.ResourcePath(n.DomainResource(id)), ReasonDomainConflict,
					fmt.Sprintf("the pod names two NVSwitch domains (%s in %s and %s here), but all its GPUs must come from one; remove the hand-written %s/nvswitch-domain-* resources and let nvdomain choose",
						n.DomainResource(d), first.Path, n.DomainResource(id), n.ResourcePrefix())})
			}
		}
	}
	if len(vs) > 0 {
		return vs // with two domains named, the per-container checks would only repeat it
	}
	if d < 0 {
		if ann, ok := pod.Annotations[n.PodDomainAnnotation()]; ok {
			vs = append(vs, Violation{"metadata.annotations[" + n.PodDomainAnnotation() + "]", ReasonDomainConflict,
				fmt.Sprintf("says domain %s but no container holds a %s/nvswitch-domain-<id> resource; remove the annotation, nvdomain sets it", ann, n.ResourcePrefix())})
		}
		return vs
	}
	res := n.DomainResource(d)
	for _, c := range p.Containers {
		if c.Init && c.GPUs == 0 && c.DomainGPUs == 0 {
			continue
		}
		got := int(c.Resources[corev1.ResourceName(res)])
		if got != c.GPUs && (c.GPUs > 0 || got > 0) {
			vs = append(vs, Violation{c.ResourcePath(res), ReasonDomainConflict,
				fmt.Sprintf("%s: %d does not match %s: %d in the same container; the two counts must be equal (nvdomain adds the domain resource itself, so remove hand-written ones)",
					res, got, names.GPUResource, c.GPUs)})
		}
	}
	if ann, ok := pod.Annotations[n.PodDomainAnnotation()]; ok && ann != strconv.Itoa(d) {
		vs = append(vs, Violation{"metadata.annotations[" + n.PodDomainAnnotation() + "]", ReasonDomainConflict,
			fmt.Sprintf("says domain %s but the containers hold %s; remove the annotation, nvdomain sets it", ann, res)})
	}
	for key := range pod.Spec.NodeSelector {
		if id, ok := n.ParseDomainSizeLabel(key); ok && id != d {
			vs = append(vs, Violation{"spec.nodeSelector[" + key + "]", ReasonDomainConflict,
				fmt.Sprintf("selects on domain %d but the containers hold %s; remove the selector, nvdomain adds the affinity itself", id, res)})
		}
	}
	if a := pod.Spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		for ti, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
			for ei, expr := range term.MatchExpressions {
				if id, ok := n.ParseDomainSizeLabel(expr.Key); ok && id != d {
					vs = append(vs, Violation{fmt.Sprintf("spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[%d].matchExpressions[%d]", ti, ei), ReasonDomainConflict,
						fmt.Sprintf("requires %s but the containers hold %s; a pod's affinity and domain resources must name the same domain; remove the hand-written expression", expr.Key, res)})
				}
			}
		}
	}
	return vs
}

// requiredTermsPath is the field of a pod's required node-selector terms.
const requiredTermsPath = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"

// ValidateNodeAffinity refuses a pod whose required node-selector terms are all empty. The
// scheduler reads an empty term as one that matches no node (terms are ORed, so one term with
// an expression is enough), and the API server accepts it, so such a pod would wait Pending
// forever; nvdomain also never adds its own expressions to an empty term, since that would
// make it select nodes the user never asked for. Only the user can say what was meant.
func ValidateNodeAffinity(pod *corev1.Pod) []Violation {
	a := pod.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return nil
	}
	terms := a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) == 0 || slices.ContainsFunc(terms, func(t corev1.NodeSelectorTerm) bool {
		return len(t.MatchExpressions) > 0 || len(t.MatchFields) > 0
	}) {
		return nil
	}
	field, which, term := requiredTermsPath+"[0]", "the only term is", "the term"
	if len(terms) > 1 {
		field, which, term = requiredTermsPath, fmt.Sprintf("all %d terms are", len(terms)), "a term"
	}
	return []Violation{{field, ReasonNoNodeSelected, which + " empty, and an empty node-selector term matches no node, so this pod could never be scheduled; give " +
		term + " matchExpressions or matchFields that name the nodes you want, or remove requiredDuringSchedulingIgnoredDuringExecution"}}
}

// Engine command-line flags that fix how many GPUs the engine uses: vLLM, SGLang and
// TensorRT-LLM spellings. An engine uses tensor × pipeline × data parallel GPUs.
var (
	tpFlags = []string{"--tensor-parallel-size", "-tp", "--tp-size", "--tp", "--tp_size"}
	ppFlags = []string{"--pipeline-parallel-size", "-pp", "--pp-size", "--pp_size"}
	dpFlags = []string{"--data-parallel-size", "-dp", "--dp-size", "--dp", "--dp_size"}
)

var envRef = regexp.MustCompile(`^\$(\(([A-Za-z_][A-Za-z0-9_]*)\)|\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))$`)

type flagHit struct {
	flag, value, field string
}

// engineMismatch compares the parallelism flags on a container's command line with its GPUs.
// It reads command and args, and the script of `sh -c`/`bash -c`, and resolves $(VAR) and
// $VAR from literal env values; a value it cannot resolve is not judged.
//
// In a LeaderWorkerSet group (g) the engine spans the group: vLLM over Ray, SGLang's
// --nnodes and TensorRT-LLM count tensor × pipeline parallel over every pod, so the flags
// may also equal the group's size times the container's GPUs.
func engineMismatch(c Container, g *Group) (Violation, bool) {
	hits := map[string]flagHit{}
	scan := func(tokens []string, fieldOf func(i int) string) {
		for i := 0; i < len(tokens); i++ {
			tok := tokens[i]
			name, value, hasValue := strings.Cut(tok, "=")
			for _, group := range [][]string{tpFlags, ppFlags, dpFlags} {
				if !slices.Contains(group, name) {
					continue
				}
				if !hasValue {
					if i+1 >= len(tokens) {
						continue
					}
					value = tokens[i+1]
				}
				if _, seen := hits[group[0]]; !seen {
					hits[group[0]] = flagHit{name, value, fieldOf(i)}
				}
			}
		}
	}
	spec := c.spec
	all := append(slices.Clone(spec.Command), spec.Args...)
	fieldOf := func(i int) string {
		if i < len(spec.Command) {
			return fmt.Sprintf("%s.command[%d]", c.Path, i)
		}
		return fmt.Sprintf("%s.args[%d]", c.Path, i-len(spec.Command))
	}
	scan(all, fieldOf)
	for i, tok := range all {
		if (tok == "-c" || tok == "-lc") && i > 0 && i+1 < len(all) && isShell(all[:i]) {
			script := all[i+1]
			scan(shellWords(script), func(int) string { return fieldOf(i + 1) })
		}
	}
	tp, ok := hits[tpFlags[0]]
	if !ok {
		return Violation{}, false
	}
	product, parts := 1, []string{}
	for _, key := range []string{tpFlags[0], ppFlags[0], dpFlags[0]} {
		h, ok := hits[key]
		if !ok {
			continue
		}
		v, ok := resolve(h.value, spec.Env)
		if !ok {
			return Violation{}, false
		}
		product *= v
		parts = append(parts, fmt.Sprintf("%s %d", h.flag, v))
	}
	if product == c.GPUs || (g != nil && product == g.Size*c.GPUs) {
		return Violation{}, false
	}
	says := parts[0]
	if len(parts) > 1 {
		says = fmt.Sprintf("%s (= %d GPUs)", strings.Join(parts, " × "), product)
	}
	if g != nil {
		return Violation{tp.field, ReasonEngineMismatch,
			fmt.Sprintf("%s disagrees with the group's %d pods × %d GPUs (%d GPUs; %s=%d, %s: %d in resources.limits) and with the container's own %d GPUs; the engine would fail or leave GPUs idle, so set the flags to the group's GPUs, or change the group size or the GPUs per pod",
				says, g.Size, c.GPUs, g.Size*c.GPUs, names.LWSSizeAnnotation, g.Size, names.GPUResource, c.GPUs, c.GPUs)}, true
	}
	return Violation{tp.field, ReasonEngineMismatch,
		fmt.Sprintf("%s disagrees with the container's %d GPUs (%s: %d in resources.limits); the engine would fail or leave GPUs idle, so set both to the same number",
			says, c.GPUs, names.GPUResource, c.GPUs)}, true
}

func isShell(prefix []string) bool {
	for _, t := range prefix {
		base := t[strings.LastIndex(t, "/")+1:]
		if base == "sh" || base == "bash" || base == "dash" || base == "ash" {
			return true
		}
	}
	return false
}

func resolve(value string, env []corev1.EnvVar) (int, bool) {
	if m := envRef.FindStringSubmatch(value); m != nil {
		name := m[2] + m[3] + m[4]
		found := false
		for _, e := range env {
			if e.Name == name && e.ValueFrom == nil {
				value, found = e.Value, true
			}
		}
		if !found {
			return 0, false
		}
	}
	v, err := strconv.Atoi(strings.Trim(value, `"'`))
	if err != nil || v <= 0 {
		return 0, false
	}
	return v, true
}

// shellWords splits a shell script into words well enough to find flags: quotes group,
// backslashes escape, and ; & | and newlines separate.
func shellWords(s string) []string {
	var words []string
	var cur strings.Builder
	var quote rune
	inWord := false
	flush := func() {
		if inWord {
			words = append(words, cur.String())
			cur.Reset()
			inWord = false
		}
	}
	escaped := false
	for _, r := range s {
		switch {
		case escaped:
			cur.WriteRune(r)
			escaped, inWord = false, true
		case r == '\\' && quote != '\'':
			escaped = true
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case r == '"' || r == '\'':
			quote, inWord = r, true
		case r == ' ' || r == '\t' || r == '\n' || r == ';' || r == '&' || r == '|':
			flush()
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	flush()
	return words
}

func shown(allowed []int, largestFn func() int) []int {
	largest := 0
	if largestFn != nil {
		largest = largestFn()
	}
	var out []int
	for _, v := range allowed {
		if largest <= 0 || v <= largest {
			out = append(out, v)
		}
	}
	if len(out) == 0 {
		return allowed
	}
	return out
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ", ")
}

// Package schedprof reads where a real kube-scheduler spends its CPU: a CPU profile over a
// window from its /debug/pprof, attributed to the scheduling framework's plugins and extension
// points (and to the queue, the cache, the informers, the binding cycle and the garbage
// collector for what no plugin runs), and its scheduling-attempt and plugin counters from
// /metrics. The scale runs (test/scale) take one of each per phase, so that the cost a pinned
// pod adds can be named by plugin rather than guessed (docs/benchmarks.md, section 5).
package schedprof

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/google/pprof/profile"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Client reads one scheduler's debug endpoints.
type Client struct {
	base string
	http *http.Client
}

// New reads the scheduler serving at base (https://host:port). The scheduler's certificate
// is the self-signed one it makes for itself, on loopback inside the test's network
// namespace, so it is not verified.
func New(base string) *Client {
	return &Client{base: strings.TrimRight(base, "/"), http: &http.Client{Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the test's own scheduler on loopback
	}}}
}

// NewHTTP reads the debug endpoints served at base through hc: a client the server
// authenticates, such as kube-apiserver's (rest.HTTPClientFor), whose /debug/pprof needs it.
func NewHTTP(base string, hc *http.Client) *Client {
	return &Client{base: strings.TrimRight(base, "/"), http: hc}
}

func (c *Client) get(ctx context.Context, path string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+path, nil)
	if err != nil {
		return nil, fmt.Errorf("kube-scheduler %s: %w", path, err)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("kube-scheduler %s: %w", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("kube-scheduler %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("kube-scheduler %s: %s: %s", path, resp.Status, bytes.TrimSpace(body[:min(len(body), 300)]))
	}
	return body, nil
}

// Ready waits until the scheduler serves its debug endpoints.
func (c *Client) Ready(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		if _, last = c.get(ctx, "/healthz"); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kube-scheduler's debug endpoints never answered: %w", last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// CPUProfile records the scheduler's CPU for d (whole seconds, at least one) and returns the
// profile as pprof writes it.
func (c *Client) CPUProfile(ctx context.Context, d time.Duration) ([]byte, error) {
	return c.get(ctx, fmt.Sprintf("/debug/pprof/profile?seconds=%d", max(1, int(d.Round(time.Second).Seconds()))))
}

// CPUProfileUntil records the scheduler's CPU in windows of chunk until stop is closed (the
// window under way when it closes is finished) and returns the windows merged into one
// profile: a run whose end is not known in advance is covered whole, overshooting by less
// than one window.
func (c *Client) CPUProfileUntil(ctx context.Context, stop <-chan struct{}, chunk time.Duration) ([]byte, error) {
	var parts []*profile.Profile
	for {
		data, err := c.CPUProfile(ctx, chunk)
		if err != nil {
			return nil, err
		}
		p, err := profile.Parse(bytes.NewReader(data))
		if err != nil {
			return nil, fmt.Errorf("parse the CPU profile: %w", err)
		}
		parts = append(parts, p)
		select {
		case <-stop:
			merged, err := profile.Merge(parts)
			if err != nil {
				return nil, fmt.Errorf("merge %d CPU profiles: %w", len(parts), err)
			}
			// The whole is the windows' sum, set here rather than left to Merge's own rule.
			merged.DurationNanos = 0
			for _, p := range parts {
				merged.DurationNanos += p.DurationNanos
			}
			var buf bytes.Buffer
			if err := merged.Write(&buf); err != nil {
				return nil, fmt.Errorf("write the merged CPU profile: %w", err)
			}
			return buf.Bytes(), nil
		default:
		}
	}
}

// Counters are the scheduler's cumulative counters that explain its CPU.
type Counters struct {
	// Attempts are scheduling cycles by result: scheduled, unschedulable, error
	// (scheduler_schedule_attempts_total).
	Attempts map[string]float64
	// PointSeconds is the time spent at each extension point, over all its plugins, every
	// cycle (scheduler_framework_extension_point_duration_seconds_sum). The per-plugin
	// histogram is left out: the scheduler records it for a tenth of its cycles through a
	// buffer that drops observations when full, so neither its sums nor its counts compare
	// between runs.
	PointSeconds map[string]float64
	// Batch counts the scheduler's opportunistic batching by result: hint_used (the cycle
	// reused the previous pod's filtering and scoring), hint_not_used, no_hint
	// (scheduler_batch_attempts_total).
	Batch map[string]float64
}

// Metrics reads the counters now.
func (c *Client) Metrics(ctx context.Context) (Counters, error) {
	body, err := c.get(ctx, "/metrics")
	if err != nil {
		return Counters{}, err
	}
	return ParseMetrics(body)
}

// ParseMetrics reads Counters from the scheduler's /metrics text.
func ParseMetrics(text []byte) (Counters, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(text))
	if err != nil {
		return Counters{}, fmt.Errorf("parse kube-scheduler's metrics: %w", err)
	}
	out := Counters{Attempts: map[string]float64{}, PointSeconds: map[string]float64{}, Batch: map[string]float64{}}
	if f, ok := fams["scheduler_schedule_attempts_total"]; ok {
		for _, m := range f.GetMetric() {
			out.Attempts[labelValue(m.GetLabel(), "result")] += m.GetCounter().GetValue()
		}
	}
	if f, ok := fams["scheduler_batch_attempts_total"]; ok {
		for _, m := range f.GetMetric() {
			out.Batch[labelValue(m.GetLabel(), "result")] += m.GetCounter().GetValue()
		}
	}
	if f, ok := fams["scheduler_framework_extension_point_duration_seconds"]; ok {
		for _, m := range f.GetMetric() {
			out.PointSeconds[labelValue(m.GetLabel(), "extension_point")] += m.GetHistogram().GetSampleSum()
		}
	}
	return out, nil
}

func labelValue(labels []*dto.LabelPair, name string) string {
	for _, l := range labels {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// Sub is what the counters grew by since before.
func (c Counters) Sub(before Counters) Counters {
	sub := func(a, b map[string]float64) map[string]float64 {
		out := map[string]float64{}
		for k, v := range a {
			if d := v - b[k]; d != 0 {
				out[k] = d
			}
		}
		return out
	}
	return Counters{Attempts: sub(c.Attempts, before.Attempts), PointSeconds: sub(c.PointSeconds, before.PointSeconds),
		Batch: sub(c.Batch, before.Batch)}
}

// Area is a part of the scheduler's work and the CPU the profile saw in it.
type Area struct {
	Name string
	CPU  time.Duration
	// Share is CPU over the profile's total.
	Share float64
}

// Summary is a CPU profile read by area.
type Summary struct {
	// Total is all the CPU the profile sampled, over Duration of wall time.
	Total, Duration time.Duration
	// Areas are the parts of the work, the largest first (see Attribute).
	Areas []Area
	// Top are the functions with the most CPU of their own (flat), the largest first.
	Top []Area
}

// Summarize reads a CPU profile into areas and its topN functions by their own CPU.
func Summarize(data []byte, topN int) (Summary, error) {
	p, err := profile.Parse(bytes.NewReader(data))
	if err != nil {
		return Summary{}, fmt.Errorf("parse the CPU profile: %w", err)
	}
	vi := -1
	for i, st := range p.SampleType {
		if st.Type == "cpu" && st.Unit == "nanoseconds" {
			vi = i
		}
	}
	if vi < 0 {
		return Summary{}, fmt.Errorf("the profile has no cpu/nanoseconds samples (types %v)", p.SampleType)
	}
	areas, flat := map[string]int64{}, map[string]int64{}
	var total int64
	for _, s := range p.Sample {
		v := s.Value[vi]
		total += v
		frames := rootFirst(s)
		areas[Attribute(frames)] += v
		if n := len(frames); n > 0 {
			flat[frames[n-1]] += v
		}
	}
	sum := Summary{Total: time.Duration(total), Duration: time.Duration(p.DurationNanos)}
	sum.Areas = ranked(areas, total, 0)
	sum.Top = ranked(flat, total, topN)
	return sum, nil
}

// rootFirst is a sample's stack as function names, from the goroutine's root to the leaf,
// inlined calls included (pprof lists each location's lines innermost first, and the
// locations leaf first).
func rootFirst(s *profile.Sample) []string {
	var out []string
	for i := len(s.Location) - 1; i >= 0; i-- {
		lines := s.Location[i].Line
		for j := len(lines) - 1; j >= 0; j-- {
			if f := lines[j].Function; f != nil {
				out = append(out, f.Name)
			}
		}
	}
	return out
}

func ranked(m map[string]int64, total int64, n int) []Area {
	var out []Area
	for k, v := range m {
		a := Area{Name: k, CPU: time.Duration(v)}
		if total > 0 {
			a.Share = float64(v) / float64(total)
		}
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b Area) int {
		if a.CPU != b.CPU {
			return int(b.CPU - a.CPU)
		}
		return strings.Compare(a.Name, b.Name)
	})
	if n > 0 && len(out) > n {
		out = out[:n]
	}
	return out
}

const (
	schedulerPkg = "k8s.io/kubernetes/pkg/scheduler"
	pluginsPkg   = schedulerPkg + "/framework/plugins/"
)

// method is the method or function a symbol inside its package names: Filter for
// (*Fit).Filter, DefaultBinder.Bind's Bind, Filter.func1's Filter (a closure), fitsRequest.
func method(sym string) string {
	if i := strings.LastIndex(sym, ")."); i >= 0 {
		sym = sym[i+2:]
	} else if typ, m, ok := strings.Cut(sym, "."); ok && typ != "" && typ[0] >= 'A' && typ[0] <= 'Z' && !strings.HasPrefix(m, "func") {
		sym = m // a value receiver's method
	}
	fn, _, _ := strings.Cut(sym, ".")
	return fn
}

// Attribute names the part of the scheduler's work a stack (root first) belongs to:
//   - "<plugin package> <function>" for the outermost frame in a plugin's package: the
//     extension point the framework called (nodeaffinity Filter, noderesources Score, …),
//     prefixed "from the queue:" when the scheduling queue called it (queueing hints on a
//     cluster event, PreEnqueue, pod signatures);
//   - "scheduling cycle (framework)" for the rest of a scheduling cycle: the snapshot, the
//     parallel walk over nodes, score normalisation and selection;
//   - "binding cycle", "scheduling queue", "cache", "informers (watch decoding, event
//     handlers)", "metrics", "events", "API client", "garbage collector", "Go runtime
//     (goroutine scheduling)", and "other" for everything else.
func Attribute(stack []string) string {
	queue := false
	for _, f := range stack {
		if strings.HasPrefix(f, schedulerPkg+"/backend/queue.") || strings.HasPrefix(f, schedulerPkg+"/internal/queue.") {
			queue = true
		}
		if rest, ok := strings.CutPrefix(f, pluginsPkg); ok {
			pkg, fn, _ := strings.Cut(rest, ".")
			fn = method(fn)
			if queue {
				return "from the queue: " + pkg + " " + fn
			}
			return pkg + " " + fn
		}
	}
	has := func(subs ...string) bool {
		for _, f := range stack {
			for _, s := range subs {
				if strings.Contains(f, s) {
					return true
				}
			}
		}
		return false
	}
	switch {
	case has("scheduler.(*Scheduler).runBindingCycle", "scheduler.(*Scheduler).bindingCycle", "scheduler.(*Scheduler).bind"):
		return "binding cycle"
	case has("scheduler.(*Scheduler).schedulingCycle", "scheduler.(*Scheduler).schedulingAlgorithm", "scheduler.(*Scheduler).schedulePod",
		"scheduler.(*Scheduler).findNodesThatFitPod", "scheduler.(*Scheduler).findNodesThatPassFilters", "scheduler.prioritizeNodes",
		schedulerPkg+"/framework/runtime."):
		return "scheduling cycle (framework)"
	case queue:
		return "scheduling queue"
	case has(schedulerPkg+"/backend/cache.", schedulerPkg+"/internal/cache."):
		return "cache"
	case has("k8s.io/client-go/tools/cache.", "k8s.io/client-go/informers.", "k8s.io/apimachinery/pkg/watch."):
		return "informers (watch decoding, event handlers)"
	case has(schedulerPkg + "/metrics."):
		return "metrics"
	case has("k8s.io/client-go/tools/events.", "k8s.io/client-go/tools/record."):
		return "events"
	case has("k8s.io/client-go/rest.", "net/http.", "golang.org/x/net/http2.", "crypto/tls."):
		return "API client"
	case has("runtime.gcBgMarkWorker", "runtime.bgsweep", "runtime.bgscavenge"):
		return "garbage collector"
	case len(stack) > 0 && (stack[0] == "runtime.mcall" || stack[0] == "runtime.morestack" || stack[0] == "runtime.sysmon" || stack[0] == "runtime.mstart"):
		return "Go runtime (goroutine scheduling)"
	}
	return "other"
}

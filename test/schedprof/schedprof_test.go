package schedprof

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"
)

const (
	fw      = "k8s.io/kubernetes/pkg/scheduler/framework/runtime.(*frameworkImpl).RunFilterPlugins"
	par     = "k8s.io/client-go/util/workqueue.ParallelizeUntil.func1"
	walk    = "k8s.io/kubernetes/pkg/scheduler.(*Scheduler).findNodesThatPassFilters.func1"
	fit     = "k8s.io/kubernetes/pkg/scheduler/framework/plugins/noderesources.(*Fit).Filter"
	fitReq  = "k8s.io/kubernetes/pkg/scheduler/framework/plugins/noderesources.fitsRequest"
	regex   = "regexp.(*Regexp).doExecute"
	binder  = "k8s.io/kubernetes/pkg/scheduler/framework/plugins/defaultbinder.DefaultBinder.Bind"
	queueQH = "k8s.io/kubernetes/pkg/scheduler/backend/queue.(*PriorityQueue).isPodWorthRequeuing"
)

func TestAttribute(t *testing.T) {
	for _, tc := range []struct {
		name  string
		stack []string
		want  string
	}{
		{"a plugin's Filter, whatever it calls", []string{par, walk, fw, fit, fitReq, regex}, "noderesources Filter"},
		{"a value receiver's method", []string{"k8s.io/kubernetes/pkg/scheduler.(*Scheduler).runBindingCycle", binder}, "defaultbinder Bind"},
		{"a closure inside a plugin's method", []string{par, walk, fw, "k8s.io/kubernetes/pkg/scheduler/framework/plugins/nodeaffinity.(*NodeAffinity).Score.func1"}, "nodeaffinity Score"},
		{"a queueing hint", []string{"k8s.io/client-go/tools/cache.(*processorListener).run", queueQH,
			"k8s.io/kubernetes/pkg/scheduler/framework/plugins/noderesources.(*Fit).isSchedulableAfterPodEvent"}, "from the queue: noderesources isSchedulableAfterPodEvent"},
		{"the walk outside any plugin", []string{par, walk, fw, "runtime.mallocgc"}, "scheduling cycle (framework)"},
		{"the binding cycle's API call", []string{"k8s.io/kubernetes/pkg/scheduler.(*Scheduler).runBindingCycle", "k8s.io/kubernetes/pkg/scheduler.(*Scheduler).bind", "net/http.(*Transport).RoundTrip"}, "binding cycle"},
		{"the queue alone", []string{"k8s.io/kubernetes/pkg/scheduler/backend/queue.(*PriorityQueue).flushBackoffQCompleted"}, "scheduling queue"},
		{"watch decoding", []string{"k8s.io/apimachinery/pkg/watch.(*StreamWatcher).receive", "k8s.io/apimachinery/pkg/runtime/serializer/protobuf.(*Serializer).Decode"}, "informers (watch decoding, event handlers)"},
		{"the garbage collector", []string{"runtime.gcBgMarkWorker", "runtime.scanObject"}, "garbage collector"},
		{"goroutine scheduling", []string{"runtime.mcall", "runtime.park_m", "runtime.schedule"}, "Go runtime (goroutine scheduling)"},
		{"events", []string{"k8s.io/client-go/tools/events.(*eventBroadcasterImpl).StartRecordingToSink.func1"}, "events"},
		{"anything else", []string{"main.main"}, "other"},
		{"an empty stack", nil, "other"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Attribute(tc.stack); got != tc.want {
				t.Errorf("Attribute = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestMethod(t *testing.T) {
	for sym, want := range map[string]string{
		"(*Fit).Filter":         "Filter",
		"DefaultBinder.Bind":    "Bind",
		"(*Fit).Score.func2":    "Score",
		"fitsRequest":           "fitsRequest",
		"fitsRequest.func1":     "fitsRequest",
		"New":                   "New",
		"(*NodeAffinity).Score": "Score",
	} {
		if got := method(sym); got != want {
			t.Errorf("method(%q) = %q, want %q", sym, got, want)
		}
	}
}

const metricsText = `# HELP scheduler_schedule_attempts_total [STABLE] attempts
# TYPE scheduler_schedule_attempts_total counter
scheduler_schedule_attempts_total{profile="default-scheduler",result="scheduled"} 120
scheduler_schedule_attempts_total{profile="default-scheduler",result="unschedulable"} 7
# HELP scheduler_plugin_execution_duration_seconds [ALPHA] plugin time
# TYPE scheduler_plugin_execution_duration_seconds histogram
scheduler_plugin_execution_duration_seconds_bucket{extension_point="Filter",plugin="NodeAffinity",status="Success",le="+Inf"} 40
scheduler_plugin_execution_duration_seconds_sum{extension_point="Filter",plugin="NodeAffinity",status="Success"} 0.25
scheduler_plugin_execution_duration_seconds_count{extension_point="Filter",plugin="NodeAffinity",status="Success"} 40
scheduler_plugin_execution_duration_seconds_bucket{extension_point="Filter",plugin="NodeAffinity",status="UnschedulableAndUnresolvable",le="+Inf"} 10
scheduler_plugin_execution_duration_seconds_sum{extension_point="Filter",plugin="NodeAffinity",status="UnschedulableAndUnresolvable"} 0.05
scheduler_plugin_execution_duration_seconds_count{extension_point="Filter",plugin="NodeAffinity",status="UnschedulableAndUnresolvable"} 10
# HELP scheduler_framework_extension_point_duration_seconds [STABLE] point time
# TYPE scheduler_framework_extension_point_duration_seconds histogram
scheduler_framework_extension_point_duration_seconds_bucket{extension_point="Score",profile="default-scheduler",status="Success",le="+Inf"} 127
scheduler_framework_extension_point_duration_seconds_sum{extension_point="Score",profile="default-scheduler",status="Success"} 1.5
scheduler_framework_extension_point_duration_seconds_count{extension_point="Score",profile="default-scheduler",status="Success"} 127
# HELP scheduler_batch_attempts_total [ALPHA] batching
# TYPE scheduler_batch_attempts_total counter
scheduler_batch_attempts_total{profile="default-scheduler",result="no_hint"} 100
scheduler_batch_attempts_total{profile="default-scheduler",result="hint_used"} 20
`

func TestParseMetricsAndSub(t *testing.T) {
	c, err := ParseMetrics([]byte(metricsText))
	if err != nil {
		t.Fatal(err)
	}
	if c.Attempts["scheduled"] != 120 || c.Attempts["unschedulable"] != 7 {
		t.Errorf("attempts %v", c.Attempts)
	}
	if c.PointSeconds["Score"] != 1.5 || c.Batch["hint_used"] != 20 {
		t.Errorf("points %v, batch %v", c.PointSeconds, c.Batch)
	}
	before, err := ParseMetrics([]byte(strings.ReplaceAll(metricsText, `result="scheduled"} 120`, `result="scheduled"} 100`)))
	if err != nil {
		t.Fatal(err)
	}
	d := c.Sub(before)
	if d.Attempts["scheduled"] != 20 {
		t.Errorf("growth of scheduled %v, want 20", d.Attempts["scheduled"])
	}
	if _, ok := d.Attempts["unschedulable"]; ok {
		t.Errorf("a counter that did not grow is listed: %v", d.Attempts)
	}
	if _, err := ParseMetrics([]byte("scheduler_schedule_attempts_total{result=\"x\" 1\n")); err == nil {
		t.Error("broken metrics text parsed")
	}
}

// profileOf writes a CPU profile whose samples have the given stacks (root first) and CPU.
func profileOf(t *testing.T, samples map[string]time.Duration) []byte {
	t.Helper()
	p := &profile.Profile{
		SampleType:    []*profile.ValueType{{Type: "samples", Unit: "count"}, {Type: "cpu", Unit: "nanoseconds"}},
		DurationNanos: int64(10 * time.Second),
		PeriodType:    &profile.ValueType{Type: "cpu", Unit: "nanoseconds"}, Period: int64(10 * time.Millisecond),
	}
	funcs := map[string]*profile.Function{}
	locs := map[string]*profile.Location{}
	for stack, cpu := range samples {
		frames := strings.Split(stack, " > ")
		var s profile.Sample
		for i := len(frames) - 1; i >= 0; i-- { // leaf first
			name := frames[i]
			if funcs[name] == nil {
				funcs[name] = &profile.Function{ID: uint64(len(funcs) + 1), Name: name}
				p.Function = append(p.Function, funcs[name])
				locs[name] = &profile.Location{ID: uint64(len(locs) + 1), Line: []profile.Line{{Function: funcs[name]}}}
				p.Location = append(p.Location, locs[name])
			}
			s.Location = append(s.Location, locs[name])
		}
		s.Value = []int64{int64(cpu / (10 * time.Millisecond)), int64(cpu)}
		p.Sample = append(p.Sample, &s)
	}
	var buf bytes.Buffer
	if err := p.Write(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestSummarize(t *testing.T) {
	data := profileOf(t, map[string]time.Duration{
		strings.Join([]string{par, walk, fw, fit, fitReq, regex}, " > "): 600 * time.Millisecond,
		strings.Join([]string{par, walk, fw, fit, fitReq}, " > "):        100 * time.Millisecond,
		"runtime.gcBgMarkWorker > runtime.scanObject":                    300 * time.Millisecond,
	})
	s, err := Summarize(data, 2)
	if err != nil {
		t.Fatal(err)
	}
	if s.Total != time.Second || s.Duration != 10*time.Second {
		t.Errorf("total %v over %v, want 1s over 10s", s.Total, s.Duration)
	}
	if len(s.Areas) != 2 || s.Areas[0].Name != "noderesources Filter" || s.Areas[0].CPU != 700*time.Millisecond || s.Areas[1].Name != "garbage collector" {
		t.Fatalf("areas %+v", s.Areas)
	}
	if s.Areas[0].Share < 0.6999 || s.Areas[0].Share > 0.7001 {
		t.Errorf("share %v, want 0.7", s.Areas[0].Share)
	}
	// Flat: the leaf's own CPU, the topN largest.
	if len(s.Top) != 2 || s.Top[0].Name != regex || s.Top[1].Name != "runtime.scanObject" {
		t.Errorf("top %+v", s.Top)
	}
	if _, err := Summarize([]byte("not a profile"), 5); err == nil {
		t.Error("garbage summarised")
	}
}

// The client against a stand-in for the scheduler's debug server: the profile's length is
// asked in whole seconds, and an error status is an error naming the path.
func TestClient(t *testing.T) {
	var asked string
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/healthz":
			_, _ = w.Write([]byte("ok"))
		case "/metrics":
			_, _ = w.Write([]byte(metricsText))
		case "/debug/pprof/profile":
			asked = r.URL.Query().Get("seconds")
			_, _ = w.Write([]byte("profile"))
		default:
			http.Error(w, "forbidden", http.StatusForbidden)
		}
	}))
	defer srv.Close()
	c := New(srv.URL + "/")
	ctx := context.Background()
	if err := c.Ready(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if data, err := c.CPUProfile(ctx, 2400*time.Millisecond); err != nil || string(data) != "profile" || asked != "2" {
		t.Errorf("profile %q, %v, seconds=%s", data, err, asked)
	}
	if _, err := c.CPUProfile(ctx, 0); err != nil || asked != "1" {
		t.Errorf("a zero window asked seconds=%s (%v), want 1", asked, err)
	}
	if m, err := c.Metrics(ctx); err != nil || m.Attempts["scheduled"] != 120 {
		t.Errorf("metrics %+v, %v", m, err)
	}
	if _, err := c.get(ctx, "/configz"); err == nil || !strings.Contains(err.Error(), "/configz") || !strings.Contains(err.Error(), "403") {
		t.Errorf("a refused path: %v", err)
	}
}

// A profile taken until a stop covers every window, merged: samples add up, and so do the
// windows' lengths.
func TestCPUProfileUntil(t *testing.T) {
	one := profileOf(t, map[string]time.Duration{strings.Join([]string{par, walk, fw, fit}, " > "): 100 * time.Millisecond})
	stop := make(chan struct{})
	calls := 0
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		if calls == 3 {
			close(stop) // the run ends during the third window
		}
		_, _ = w.Write(one)
	}))
	defer srv.Close()
	data, err := New(srv.URL).CPUProfileUntil(context.Background(), stop, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Summarize(data, 1)
	if err != nil {
		t.Fatal(err)
	}
	if calls != 3 || s.Total != 300*time.Millisecond || s.Duration != 30*time.Second {
		t.Errorf("%d windows: %v of CPU over %v, want 3 windows, 300ms over 30s", calls, s.Total, s.Duration)
	}
}

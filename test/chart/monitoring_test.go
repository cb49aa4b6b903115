package chart

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	nriplugin "github.com/nvdomain/nvdomain/nri-plugin"
	"github.com/nvdomain/nvdomain/pkg/agent"
	"github.com/nvdomain/nvdomain/pkg/dra"
	"github.com/nvdomain/nvdomain/webhook"
	"github.com/nvdomain/nvdomain/webhook/certrotation"
	"github.com/nvdomain/nvdomain/webhook/repin"
)

// External series the dashboard and the alerts may query besides nvdomain's own: Prometheus'
// scrape health, kube-state-metrics, DCGM exporter and cert-manager. Exact names, so that a
// misspelt one fails too.
var externalMetrics = map[string]bool{
	"up":                                   true,
	"kube_node_status_allocatable":         true,
	"kube_pod_container_resource_requests": true,
	"kube_pod_status_phase":                true,
	"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL":   true,
	"certmanager_certificate_expiration_timestamp_seconds": true,
}

// Labels Prometheus adds to every nvdomain series through the chart's ServiceMonitor and
// PodMonitor (templates/servicemonitor.yaml), which queries may match besides the metric's own.
var targetLabels = []string{"node", "namespace", "pod", "container", "job", "instance", "endpoint"}

// exported is one series name the binaries export and its label names.
type exported map[string][]string

// recorder registers with a real registry and remembers the collectors, so that the test can
// create one series of every labelled vector (Gather leaves out vectors without series).
type recorder struct {
	prometheus.Registerer
	collectors []prometheus.Collector
}

func (r *recorder) Register(c prometheus.Collector) error {
	r.collectors = append(r.collectors, c)
	return r.Registerer.Register(c)
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

var descLabels = regexp.MustCompile(`variableLabels: \{([^}]*)\}\}$`)

// exportedMetrics calls every component's NewMetrics with a fresh registry, creates one series
// of each vector and gathers: the names (with a histogram's _bucket, _sum and _count) and
// label names the binaries really export.
func exportedMetrics(t *testing.T) exported {
	t.Helper()
	out := exported{}
	components := map[string]func(prometheus.Registerer) error{
		// One registry in production (webhook/server.go), so registered together.
		"webhook": func(r prometheus.Registerer) error {
			if _, err := webhook.NewMetrics(r); err != nil {
				return err
			}
			if _, err := repin.NewMetrics(r); err != nil {
				return err
			}
			if _, err := certrotation.NewMetrics(r); err != nil {
				return err
			}
			if _, err := webhook.NewPoolMetrics(r); err != nil {
				return err
			}
			return certrotation.RegisterServedExpiry(r, filepath.Join(t.TempDir(), "tls.crt"))
		},
		"nri": func(r prometheus.Registerer) error { _, err := nriplugin.NewMetrics(r); return err },
		// The DRA driver registers on the agent's registry (pkg/agent/process.go).
		"agent": func(r prometheus.Registerer) error {
			if _, err := agent.NewMetrics(r); err != nil {
				return err
			}
			_, err := dra.NewMetrics(r)
			return err
		},
	}
	for name, register := range components {
		reg := prometheus.NewRegistry()
		rec := &recorder{Registerer: reg}
		if err := register(rec); err != nil {
			t.Fatalf("%s metrics: %v", name, err)
		}
		for _, c := range rec.collectors {
			touch(t, c)
		}
		families, err := reg.Gather()
		if err != nil {
			t.Fatalf("%s: gather: %v", name, err)
		}
		for _, f := range families {
			var labels []string
			if len(f.GetMetric()) > 0 {
				for _, lp := range f.GetMetric()[0].GetLabel() {
					labels = append(labels, lp.GetName())
				}
			}
			names := []string{f.GetName()}
			switch f.GetType().String() {
			case "HISTOGRAM":
				names = append(names, f.GetName()+"_bucket", f.GetName()+"_sum", f.GetName()+"_count")
			case "SUMMARY":
				names = append(names, f.GetName()+"_sum", f.GetName()+"_count")
			}
			for _, n := range names {
				out[n] = labels
			}
		}
	}
	return out
}

// touch creates one series of a labelled vector, with its label names read from its
// descriptor.
func touch(t *testing.T, c prometheus.Collector) {
	t.Helper()
	ch := make(chan *prometheus.Desc, 16)
	c.Describe(ch)
	close(ch)
	for d := range ch {
		m := descLabels.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read the labels of %s", d)
		}
		if m[1] == "" {
			continue
		}
		values := make([]string, len(strings.Split(m[1], ",")))
		for i := range values {
			values[i] = "x"
		}
		var err error
		switch v := c.(type) {
		case *prometheus.CounterVec:
			_, err = v.GetMetricWithLabelValues(values...)
		case *prometheus.GaugeVec:
			_, err = v.GetMetricWithLabelValues(values...)
		case *prometheus.HistogramVec:
			_, err = v.GetMetricWithLabelValues(values...)
		case *prometheus.SummaryVec:
			_, err = v.GetMetricWithLabelValues(values...)
		default:
			err = fmt.Errorf("a %T with labels; teach touch about it", c)
		}
		if err != nil {
			t.Fatalf("%s: %v", d, err)
		}
	}
}

// A PromQL expression's series names: what is left once strings, label matchers, range and
// subquery brackets, grouping clauses, functions, keywords and numbers are taken out. Crude,
// but every expression in the chart is plain enough for it, and a name it cannot account for
// fails the test rather than passing it.
var (
	promString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promMatchers = regexp.MustCompile(`\{[^{}]*\}`)
	promRange    = regexp.MustCompile(`\[[^\]]*\]`)
	promGrouping = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)`)
	promFunction = regexp.MustCompile(`\b[a-zA-Z_][a-zA-Z0-9_]*\s*\(`)
	promIdent    = regexp.MustCompile(`\b[a-zA-Z_:][a-zA-Z0-9_:]*\b`)
	promKeywords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
		"bool": true, "and": true, "or": true, "unless": true, "offset": true, "sum": true, "max": true, "min": true, "avg": true,
		"count": true, "topk": true, "bottomk": true, "e": true, "Inf": true, "NaN": true}
	// name{matchers} for a series selector, to check the label names it matches on.
	promSelector = regexp.MustCompile(`\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{[^{}]*\})`)
	promMatcher  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)`)
)

func seriesNames(expr string) []string {
	e := promString.ReplaceAllString(expr, `""`)
	e = promMatchers.ReplaceAllString(e, " ")
	e = promRange.ReplaceAllString(e, " ")
	for promGrouping.MatchString(e) {
		e = promGrouping.ReplaceAllString(e, " ")
	}
	e = promFunction.ReplaceAllString(e, "(")
	var out []string
	for _, id := range promIdent.FindAllString(e, -1) {
		if !promKeywords[id] {
			out = append(out, id)
		}
	}
	return out
}

// checkExpr reports every series name of expr that no binary exports and that is not on the
// external list, and every label a selector of an nvdomain series matches that the series
// cannot have.
func checkExpr(where, expr string, have exported) []string {
	var problems []string
	names := seriesNames(expr)
	if len(names) == 0 {
		problems = append(problems, fmt.Sprintf("%s: %q names no series", where, expr))
	}
	for _, n := range names {
		if _, ok := have[n]; !ok && !externalMetrics[n] {
			problems = append(problems, fmt.Sprintf("%s: %s is exported by no nvdomain binary and is not a known external metric (in %q)", where, n, expr))
		}
	}
	stripped := promString.ReplaceAllStringFunc(expr, func(s string) string { return strings.Repeat("x", len(s)) })
	for _, m := range promSelector.FindAllStringSubmatchIndex(stripped, -1) {
		name := expr[m[2]:m[3]]
		labels, ours := have[name]
		if !ours {
			continue
		}
		for _, lm := range promMatcher.FindAllStringSubmatch(stripped[m[4]:m[5]], -1) {
			if !slices.Contains(labels, lm[1]) && !slices.Contains(targetLabels, lm[1]) && lm[1] != "le" {
				problems = append(problems, fmt.Sprintf("%s: %s has no label %q (it has %v) in %q", where, name, lm[1], labels, expr))
			}
		}
	}
	return problems
}

// monitoringObjects renders the chart with monitoring on and returns the dashboard's
// expressions and the alerts' expressions, keyed by where they are.
func monitoringObjects(t *testing.T, args ...string) (dashboard map[string]string, alerts map[string]string) {
	t.Helper()
	out, err := render(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	dashboard, alerts = map[string]string{}, map[string]string{}
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(out), 4096)
	for {
		var raw map[string]any
		if err := dec.Decode(&raw); err != nil {
			break
		}
		switch raw["kind"] {
		case "ConfigMap":
			data, _ := raw["data"].(map[string]any)
			doc, ok := data["nvdomain.json"].(string)
			if !ok {
				continue
			}
			var dash map[string]any
			if err := json.Unmarshal([]byte(doc), &dash); err != nil {
				t.Fatalf("the dashboard ConfigMap holds invalid JSON: %v", err)
			}
			collectExprs(dash, "dashboard", dashboard)
		case "PrometheusRule":
			spec, _ := raw["spec"].(map[string]any)
			groups, _ := spec["groups"].([]any)
			for _, g := range groups {
				rules, _ := g.(map[string]any)["rules"].([]any)
				for _, r := range rules {
					rule := r.(map[string]any)
					alerts[fmt.Sprint("alert ", rule["alert"])] = fmt.Sprint(rule["expr"])
				}
			}
		}
	}
	return dashboard, alerts
}

// collectExprs finds every PromQL expression in a dashboard: panel targets' expr and the
// template variables' label_values queries.
func collectExprs(v any, path string, out map[string]string) {
	switch x := v.(type) {
	case map[string]any:
		title, _ := x["title"].(string)
		if title != "" {
			path = path + " / " + title
		}
		if e, ok := x["expr"].(string); ok {
			out[fmt.Sprintf("%s [%v]", path, x["refId"])] = e
		}
		if d, ok := x["definition"].(string); ok {
			if m := regexp.MustCompile(`^label_values\((.*),\s*\w+\)$`).FindStringSubmatch(d); m != nil {
				out[path+" variable "+fmt.Sprint(x["name"])] = m[1]
			}
		}
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			collectExprs(x[k], path, out)
		}
	case []any:
		for _, e := range x {
			collectExprs(e, path, out)
		}
	}
}

// Every series the dashboard and the alerts query is one an nvdomain binary exports (or a known
// external one), with labels it has: a renamed metric or a typo fails here, not on a blank
// panel or an alert that never fires.
func TestDashboardAndAlertsQueryExportedMetrics(t *testing.T) {
	have := exportedMetrics(t)
	for _, want := range []string{"nvdomain_webhook_admissions_total", "nvdomain_nri_refusals_total", "nvdomain_agent_domain_gpus", "nvdomain_repins_total",
		"nvdomain_webhook_certificate_expiry_timestamp_seconds", "nvdomain_webhook_decision_seconds_bucket", "nvdomain_dra_orphaned_claims"} {
		if _, ok := have[want]; !ok {
			t.Fatalf("collected %d names without %s: %v", len(have), want, have)
		}
	}
	// The extractor catches what it must: a misspelt name and a label the series lacks.
	if p := checkExpr("self-check", `sum by (node) (rate(nvdomain_nri_refusal_total{reason="x"}[5m])) / on (node) nvdomain_agent_domain_gpus{stat="capacity"}`, have); len(p) != 2 {
		t.Fatalf("the expression check found %d problems in a broken expression, want 2: %v", len(p), p)
	}

	ci := func(f string) string { return filepath.Join(root(), "charts", "nvdomain", "ci", f) }
	variants := map[string][]string{
		"self-signed":  {"-f", ci("monitoring-values.yaml")},
		"cert-manager": {"-f", ci("cert-manager-values.yaml"), "-f", ci("monitoring-values.yaml")},
		"dra":          {"-f", ci("dra-values.yaml"), "-f", ci("monitoring-values.yaml")},
	}
	for name, args := range variants {
		dashboard, alerts := monitoringObjects(t, args...)
		if len(dashboard) < 15 || len(alerts) < 7 {
			t.Fatalf("%s: found %d dashboard and %d alert expressions; the render lacks the dashboard or the rules", name, len(dashboard), len(alerts))
		}
		for _, set := range []map[string]string{dashboard, alerts} {
			for where, expr := range set {
				for _, p := range checkExpr(name+": "+where, expr, have) {
					t.Error(p)
				}
			}
		}
	}
}

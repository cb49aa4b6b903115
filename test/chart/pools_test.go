package chart

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"

	"github.com/nvdomain/nvdomain/pkg/autoscaler"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/pkg/topology/simulated"
)

// inline replaces every "$ref": "#/$defs/x" by the definition, so a 2020-12 schema with
// $defs compares with the self-contained copy the chart's draft-07 values schema holds.
func inline(v any, defs map[string]any) any {
	switch x := v.(type) {
	case map[string]any:
		if ref, ok := x["$ref"].(string); ok {
			return inline(defs[strings.TrimPrefix(ref, "#/$defs/")], defs)
		}
		out := map[string]any{}
		for k, e := range x {
			out[k] = inline(e, defs)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = inline(e, defs)
		}
		return out
	}
	return v
}

// One schema: a pool the chart accepts is a pool the document accepts, field by field.
func TestChartPoolSchemaIsTheDocuments(t *testing.T) {
	var doc map[string]any
	if err := json.Unmarshal(simulated.Schema, &doc); err != nil {
		t.Fatal(err)
	}
	defs := doc["$defs"].(map[string]any)
	want := inline(defs["pool"], defs)
	raw, err := os.ReadFile(filepath.Join(root(), "charts", "nvdomain", "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := json.Unmarshal(raw, &values); err != nil {
		t.Fatal(err)
	}
	got := values["properties"].(map[string]any)["pools"].(map[string]any)["properties"].(map[string]any)["declared"].(map[string]any)["items"]
	if !reflect.DeepEqual(got, want) {
		g, _ := json.MarshalIndent(got, "", " ")
		w, _ := json.MarshalIndent(want, "", " ")
		t.Fatalf("charts/nvdomain/values.schema.json pools.declared.items differs from the document's $defs.pool; copy it over (refs inlined)\n got %s\nwant %s", g, w)
	}
}

func TestBadPoolsAreRejectedAtInstall(t *testing.T) {
	cases := []struct {
		pools string
		want  string
	}{
		{`[{"name":"hgx","gpuCount":8,"domains":[{"gpus":[0,1]}]}]`, "at '/pools/declared/0': missing property 'nodeSelector'"},
		{`[{"name":"hgx","nodeSelector":{"karpenter.sh/nodepool":"hgx"},"gpuCount":8}]`, "at '/pools/declared/0': missing property 'domains'"},
		{`[{"name":"hgx","nodeSelector":{"karpenter.sh/nodepool":"hgx"},"gpuCount":8,"domains":[{"gpus":[0]}]}]`, "at '/pools/declared/0/domains/0/gpus'"},
		{`[{"name":"HGX","nodeSelector":{"karpenter.sh/nodepool":"hgx"},"gpuCount":8,"domains":[{"gpus":[0,1]}]}]`, "at '/pools/declared/0/name'"},
		{`[{"name":"hgx","nodeSelector":{"karpenter.sh/nodepool":"not a value"},"gpuCount":8,"domains":[{"gpus":[0,1]}]}]`, "at '/pools/declared/0/nodeSelector/karpenter.sh~1nodepool'"},
		{`[{"name":"hgx","nodeSelector":{"pool":"hgx"},"gpuCount":8,"domain":[{"gpus":[0,1]}]}]`, "at '/pools/declared/0': additional properties 'domain' not allowed"},
		{`[{"name":"hgx","nodeSelector":{"pool":"hgx"},"gpus":[{"index":0,"uuid":"GPU-1"},{"index":1}],"domains":[{"gpus":[0,1]}]}]`, "at '/pools/declared/0/gpus/0': additional properties 'uuid' not allowed"},
		{`[{"name":"hgx","nodeSelector":{"pool":"hgx"},"taints":[{"key":"nvidia.com/gpu","effect":"PreferNoSchedule"}],"gpuCount":2,"domains":[{"gpus":[0,1]}]}]`, "at '/pools/declared/0/taints/0/effect'"},
	}
	for _, tc := range cases {
		_, err := render(t, "--set-json", "pools.declared="+tc.pools)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("pools %s: %v, want an error mentioning %q", tc.pools, err, tc.want)
		}
	}
}

// The NodeOverlays the chart renders are the ones `nvdomain pools --for karpenter` prints.
func TestChartNodeOverlaysAreTheCLIs(t *testing.T) {
	values := filepath.Join(root(), "charts", "nvdomain", "ci", "pools-values.yaml")
	for _, gpus := range []bool{false, true} {
		out, err := render(t, "-f", values, "--set", "pools.karpenterNodeOverlays=true", "--set", "pools.gpuCapacity="+map[bool]string{false: "false", true: "true"}[gpus],
			"--api-versions", "karpenter.sh/v1alpha1/NodeOverlay")
		if err != nil {
			t.Fatal(err)
		}
		got := overlays(out)
		raw, err := os.ReadFile(values)
		if err != nil {
			t.Fatal(err)
		}
		var v struct {
			Pools struct {
				Declared []any `json:"declared"`
			} `json:"pools"`
		}
		if err := yaml.Unmarshal(raw, &v); err != nil {
			t.Fatal(err)
		}
		docJSON, _ := json.Marshal(map[string]any{"pools": v.Pools.Declared})
		p, err := simulated.NewParser()
		if err != nil {
			t.Fatal(err)
		}
		doc, err := p.Parse(docJSON)
		if err != nil {
			t.Fatal(err)
		}
		cli, err := autoscaler.Karpenter(doc, names.Default(), autoscaler.Options{GPUs: gpus})
		if err != nil {
			t.Fatal(err)
		}
		want := overlays(string(cli))
		if len(want) != 2 || !reflect.DeepEqual(got, want) {
			t.Fatalf("gpuCapacity=%v: chart overlays\n%v\nCLI overlays\n%v", gpus, got, want)
		}
	}
}

// overlays parses the NodeOverlays of a multi-document YAML stream, by name.
func overlays(stream string) map[string]any {
	out := map[string]any{}
	for _, obj := range documents(stream) {
		if obj["kind"] == "NodeOverlay" {
			out[obj["metadata"].(map[string]any)["name"].(string)] = obj
		}
	}
	return out
}

// The webhook's --pools-checksum is the SHA-256 of exactly the topology.json the chart writes
// into the pools ConfigMap: the replica compares the two to tell the release's own broken
// version (stop the rollout) from a hand edit (keep serving).
func TestPoolsChecksumIsTheConfigMaps(t *testing.T) {
	out, err := render(t, "-f", filepath.Join(root(), "charts", "nvdomain", "ci", "pools-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var data, sum string
	for _, obj := range documents(out) {
		switch obj["kind"] {
		case "ConfigMap":
			if obj["metadata"].(map[string]any)["name"] == "nvdomain-pools" {
				data = obj["data"].(map[string]any)["topology.json"].(string)
			}
		case "Deployment":
			var d appsv1.Deployment
			into(t, obj, &d)
			for _, a := range d.Spec.Template.Spec.Containers[0].Args {
				if v, ok := strings.CutPrefix(a, "--pools-checksum="); ok {
					sum = v
				}
			}
		}
	}
	h := sha256.Sum256([]byte(data))
	if data == "" || sum != hex.EncodeToString(h[:]) {
		t.Fatalf("--pools-checksum=%q, sha256 of the ConfigMap's topology.json (%d bytes) is %x", sum, len(data), h)
	}
}

package chart

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// helm4 builds (once) and returns the Helm 4 CLI the chart is also tested with.
func helm4(t *testing.T) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(root(), "test", "tools", "build-helm.sh"))
	cmd.Env = append(os.Environ(), "HELM_MAJOR=4")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("build helm 4: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// Helm 4 (the current major, server-side apply by default) and Helm 3 render the chart into
// the same objects for every values file CI tests (Helm 4 drops empty documents, so the streams
// are compared object by object), lint it clean, and refuse the same bad values.
func TestHelm4RendersWhatHelm3Renders(t *testing.T) {
	h4 := helm4(t)
	cases := map[string][]string{"default": nil}
	files, _ := filepath.Glob(filepath.Join(root(), "charts", "nvdomain", "ci", "*.yaml"))
	for _, f := range files {
		cases[strings.TrimSuffix(filepath.Base(f), ".yaml")] = []string{"-f", f}
	}
	chart := filepath.Join(root(), "charts", "nvdomain")
	for name, args := range cases {
		// One Kubernetes version for both: each Helm assumes its own when none is given
		// (Helm 4 its newest), and the chart renders some objects only from a version on
		// (dra.reservations from 1.36).
		args = append(args, "--kube-version", "1.37.2")
		t.Run(name, func(t *testing.T) {
			if out, err := exec.Command(h4, append([]string{"lint", "--strict", chart}, args...)...).CombinedOutput(); err != nil {
				t.Fatalf("helm 4 lint: %v\n%s", err, out)
			}
			cmd := exec.Command(h4, append([]string{"template", "nvdomain", chart, "-n", "nvdomain-system"}, args...)...)
			var out, errb bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errb
			if err := cmd.Run(); err != nil {
				t.Fatalf("helm 4 template: %v: %s", err, errb.String())
			}
			v3, err := render(t, args...)
			if err != nil {
				t.Fatal(err)
			}
			// Helm 4 orders some kinds differently; each object is compared by kind and name.
			byKey := func(docs []map[string]any) map[string]map[string]any {
				m := map[string]map[string]any{}
				for _, d := range docs {
					meta, _ := d["metadata"].(map[string]any)
					m[fmt.Sprint(d["kind"], "/", meta["namespace"], "/", meta["name"])] = d
				}
				return m
			}
			got, want := byKey(documents(out.String())), byKey(documents(v3))
			if len(got) != len(want) || len(want) == 0 {
				t.Fatalf("helm 4 renders %d objects, helm 3 %d", len(got), len(want))
			}
			for k, w := range want {
				if !reflect.DeepEqual(got[k], w) {
					t.Errorf("%s differs between helm 4 and helm 3", k)
				}
			}
		})
	}
	bad := exec.Command(h4, "template", "nvdomain", chart, "--set", "webhook.replica=3")
	if out, err := bad.CombinedOutput(); err == nil || !strings.Contains(string(out), "additional properties 'replica' not allowed") {
		t.Errorf("helm 4 accepted an unknown value: %v\n%s", err, out)
	}
}

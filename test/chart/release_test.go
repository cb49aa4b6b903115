package chart

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// `make chart` packages the chart with the release: a tag vX.Y.Z gives chart version X.Y.Z
// and appVersion vX.Y.Z, and a build between tags a 0.0.0-<describe> chart; either way the
// default image is the one `make image` tags with the same version, and every alert's runbook
// link points at that ref of the docs, so it resolves for the version installed.
func TestChartPackageFollowsTheRelease(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatalf("make is needed to package the chart: %v", err)
	}
	for _, tc := range []struct{ version, chartVersion string }{
		{"v1.2.3", "1.2.3"},
		{"v1.3.0-rc.1", "1.3.0-rc.1"},
		{"0377c9a-dirty", "0.0.0-0377c9a-dirty"},
	} {
		t.Run(tc.version, func(t *testing.T) {
			out := t.TempDir()
			mk := exec.Command("make", "-s", "-C", root(), "chart", "VERSION="+tc.version, "CHART_OUT="+out)
			if b, err := mk.CombinedOutput(); err != nil {
				t.Fatalf("make chart: %v\n%s", err, b)
			}
			pkg := filepath.Join(out, "nvdomain-"+tc.chartVersion+".tgz")
			b, err := exec.Command(helm(t), "template", "nvdomain", pkg, "-n", "nvdomain-system", "--set", "prometheusRule.enabled=true").CombinedOutput()
			if err != nil {
				t.Fatalf("helm template %s: %v\n%s", pkg, err, b)
			}
			rendered := string(b)
			for _, want := range []string{
				"image: ghcr.io/nvdomain/nvdomain:" + tc.version + "\n",
				"app.kubernetes.io/version: \"" + tc.version + "\"",
				"helm.sh/chart: nvdomain-" + tc.chartVersion,
				"runbook_url: https://github.com/nvdomain/nvdomain/blob/" + tc.version + "/docs/operations.md#",
			} {
				if !strings.Contains(rendered, want) {
					t.Errorf("the %s package renders no %q", tc.version, want)
				}
			}
		})
	}
}

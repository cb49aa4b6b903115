package names

import "testing"

func TestDRANames(t *testing.T) {
	n, err := New("gpu.example.com", "example.com")
	if err != nil {
		t.Fatal(err)
	}
	if got := n.ModeLabel(); got != "gpu.example.com/nvdomain-mode" {
		t.Errorf("ModeLabel = %q, want it under the label prefix", got)
	}
	if got := QualifiedAttribute(DRAAttrDomain); got != "gpu.nvdomain.io/nvswitchDomain" {
		t.Errorf("QualifiedAttribute = %q", got)
	}
	cases := []struct {
		name  string
		parse func(string) (int, bool)
		in    string
		want  int
		ok    bool
	}{
		{"template", ParseDRATemplate, DRATemplate(8), 8, true},
		{"template with a leading zero", ParseDRATemplate, "nvdomain-tp-08", 0, false},
		{"someone else's template", ParseDRATemplate, "team-tp-8", 0, false},
		{"device", ParseDRADeviceName, DRADeviceName(7), 7, true},
		{"device with a suffix", ParseDRADeviceName, "gpu-7-mig", 0, false},
	}
	for _, tc := range cases {
		got, ok := tc.parse(tc.in)
		if ok != tc.ok || (ok && got != tc.want) {
			t.Errorf("%s: parse(%q) = %d, %v; want %d, %v", tc.name, tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/utils/ptr"
)

// `nvdomain node install` names what to change when containerd will not read the snippet: the
// chart value when the config path is wrong, the template on RKE2/k3s, the line otherwise.
func TestNodeInstallNamesTheFix(t *testing.T) {
	cases := []struct {
		name     string
		config   *string // content of the mounted config; nil: absent
		template string
		want     []string
		not      []string
	}{
		{name: "config path absent", config: nil, want: []string{"/etc/containerd/config.toml does not exist on this node", "node.containerdConfig", "node.containerdDistribution=rke2 or k3s"}},
		{name: "no imports", config: ptr.To("version = 3\n"), want: []string{"does not import /etc/containerd/conf.d", `imports = ["/etc/containerd/conf.d/*.toml"]`, "restart containerd"}},
		{name: "no imports, k3s", config: ptr.To("version = 3\n"), template: "/var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.tmpl",
			want: []string{"generated from /var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.tmpl", `before {{ template "base" . }}`}},
		{name: "imported", config: ptr.To("imports = [\"/etc/containerd/conf.d/*.toml\"]\nversion = 3\n"), not: []string{"WARNING"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			snippet := filepath.Join(dir, "nri.toml")
			if err := os.WriteFile(snippet, []byte("[plugins]\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			confDir := filepath.Join(dir, "conf.d")
			if err := os.Mkdir(confDir, 0o755); err != nil {
				t.Fatal(err)
			}
			cfg := filepath.Join(dir, "config.toml")
			if tc.config != nil {
				if err := os.WriteFile(cfg, []byte(*tc.config), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			args := []string{"node", "install", "--nri-snippet=" + snippet, "--conf-dir=" + confDir, "--host-conf-dir=/etc/containerd/conf.d",
				"--containerd-config=" + cfg, "--host-containerd-config=/etc/containerd/config.toml"}
			if tc.template != "" {
				args = append(args, "--containerd-template="+tc.template)
			}
			cmd := newNode()
			var out bytes.Buffer
			cmd.SetOut(&out)
			cmd.SetErr(&out)
			cmd.SetArgs(args[1:])
			if err := cmd.Execute(); err != nil {
				t.Fatalf("node install: %v\n%s", err, out.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
			for _, n := range tc.not {
				if strings.Contains(out.String(), n) {
					t.Errorf("output has %q:\n%s", n, out.String())
				}
			}
		})
	}
}

package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

const twoContexts = `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:6443"}
users:
- name: u
  user: {token: t}
contexts:
- name: a
  context: {cluster: c, user: u}
- name: b
  context: {cluster: c, user: u, namespace: ns-b}
current-context: a
`

func TestKubeFlagsResolveLikeKubectl(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config")
	if err := os.WriteFile(path, []byte(twoContexts), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args         []string
		wantNS       string
		wantExplicit bool
	}{
		{[]string{"--kubeconfig", path}, "default", false},
		{[]string{"--kubeconfig", path, "--context", "b"}, "ns-b", false},
		{[]string{"--kubeconfig", path, "--context", "b", "-n", "ml"}, "ml", true},
		{[]string{"--kubeconfig", path, "--namespace=ml"}, "ml", true},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			k := &KubeFlags{}
			fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
			k.AddFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			ns, explicit, err := k.Namespace()
			if err != nil || ns != tc.wantNS || explicit != tc.wantExplicit {
				t.Errorf("Namespace() = %q, %v, %v; want %q, %v", ns, explicit, err, tc.wantNS, tc.wantExplicit)
			}
			if c, err := k.Client(); err != nil || c == nil {
				t.Errorf("Client() = %v, %v", c, err)
			}
		})
	}
}

func TestKubeFlagsNameTheFixOnBadConfig(t *testing.T) {
	k := &KubeFlags{}
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	k.AddFlags(fs)
	if err := fs.Parse([]string{"--kubeconfig", filepath.Join(t.TempDir(), "missing"), "--context", "nope"}); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Client(); err == nil || !strings.Contains(err.Error(), "--kubeconfig") {
		t.Errorf("Client() error = %v, want one naming --kubeconfig", err)
	}
}

// The plugin is the same command tree under kubectl's name.
func TestKubectlPluginNamesItself(t *testing.T) {
	var out, errb bytes.Buffer
	if code := KubectlPluginMain(context.Background(), []string{"--help"}, strings.NewReader(""), &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"kubectl nvdomain [command]", "status", "explain", "topology", "check-config"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("help lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	errb.Reset()
	if code := KubectlPluginMain(context.Background(), []string{"status", "-o", "yaml"}, strings.NewReader(""), &out, &errb); code != ExitError ||
		!strings.HasPrefix(errb.String(), "kubectl nvdomain: --output \"yaml\"") {
		t.Errorf("exit %d, stderr %q", code, errb.String())
	}
}

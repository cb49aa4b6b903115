package hostfiles

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestImports(t *testing.T) {
	for _, tc := range []struct {
		name, config string
		want         bool
	}{
		{"glob", `version = 3` + "\n" + `imports = ["/etc/containerd/conf.d/*.toml"]`, true},
		{"the file itself, single quotes", `imports = ['/etc/containerd/conf.d/nri.toml']`, true},
		{"among others", `imports = ["/etc/containerd/runtimes/*.toml", "/etc/containerd/conf.d/*.toml"]`, true},
		{"empty", `imports = []`, false},
		{"another directory", `imports = ["/etc/containerd/runtimes/*.toml"]`, false},
		{"no imports line (containerd config default without conf.d)", `version = 3` + "\n" + `root = "/var/lib/containerd"`, false},
		{"commented out", `# imports = ["/etc/containerd/conf.d/*.toml"]`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Imports([]byte(tc.config), "/etc/containerd/conf.d"); got != tc.want {
				t.Errorf("Imports = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestInstallSnippet(t *testing.T) {
	src := filepath.Join(t.TempDir(), "nri.toml")
	if err := os.WriteFile(src, []byte("[plugins.'io.containerd.nri.v1.nri']\n  disable = false\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfgDir := t.TempDir()
	cfg := filepath.Join(cfgDir, "config.toml")
	if err := os.WriteFile(cfg, []byte(`imports = ["/etc/containerd/conf.d/*.toml"]`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name                     string
		existing                 string // "" absent
		wantChanged, wantForeign bool
	}{
		{name: "absent", wantChanged: true},
		{name: "an earlier release's snippet is replaced", existing: Marker + "\n[old]\n", wantChanged: true},
		{name: "current snippet is left", existing: "CURRENT"},
		{name: "a file nvdomain did not write is left alone", existing: "[plugins.'io.containerd.nri.v1.nri']\n  disable = false # the admin's\n", wantForeign: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conf := t.TempDir()
			path := filepath.Join(conf, SnippetName)
			body, _ := os.ReadFile(src)
			want := Marker + "\n" + string(body)
			existing := tc.existing
			if existing == "CURRENT" {
				existing = want
			}
			if existing != "" {
				if err := os.WriteFile(path, []byte(existing), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			res, err := InstallSnippet(src, conf, "/etc/containerd/conf.d", cfg)
			if err != nil {
				t.Fatal(err)
			}
			if res.Changed != tc.wantChanged || res.Foreign != tc.wantForeign || !res.Imported || !res.ConfigChecked {
				t.Errorf("result %+v, want changed %v foreign %v imported", res, tc.wantChanged, tc.wantForeign)
			}
			got, _ := os.ReadFile(path)
			if tc.wantForeign {
				want = existing
			}
			if string(got) != want {
				t.Errorf("file now %q, want %q", got, want)
			}
			removed, err := Remove("", conf)
			if err != nil {
				t.Fatal(err)
			}
			_, statErr := os.Stat(path)
			if tc.wantForeign != (statErr == nil) || tc.wantForeign == (len(removed) == 1) {
				t.Errorf("Remove removed %v (file left: %v); a foreign file must stay, ours must go", removed, statErr == nil)
			}
		})
	}
}

func TestInstallSnippetWarnsWithoutImports(t *testing.T) {
	src := filepath.Join(t.TempDir(), "nri.toml")
	os.WriteFile(src, []byte("x"), 0o644)
	cfg := filepath.Join(t.TempDir(), "config.toml")
	os.WriteFile(cfg, []byte("version = 3\n"), 0o644)
	res, err := InstallSnippet(src, t.TempDir(), "/etc/containerd/conf.d", cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.Imported || !res.ConfigChecked || res.ImportHint != `imports = ["/etc/containerd/conf.d/*.toml"]` {
		t.Errorf("result %+v: want not imported, with the exact line to add", res)
	}
}

func TestInstallHookAndRemove(t *testing.T) {
	src := filepath.Join(t.TempDir(), "hook")
	os.WriteFile(src, []byte("#!hook"), 0o755)
	dir := filepath.Join(t.TempDir(), "opt", "nvdomain", "bin")
	if err := InstallHook(src, dir); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, HookName))
	if err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("hook: %v %v", fi, err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("temporary files left behind: %v", entries)
	}
	removed, err := Remove(dir, "")
	if err != nil || len(removed) != 1 || !strings.HasSuffix(removed[0], HookName) {
		t.Errorf("Remove: %v %v", removed, err)
	}
	if removed, err := Remove(dir, t.TempDir()); err != nil || len(removed) != 0 {
		t.Errorf("second Remove: %v %v; want nothing and no error", removed, err)
	}
}

// TestEarlierReleaseSnippetIsManaged: the snippet the previous release copied (no marker) is
// nvdomain's: an upgrade replaces it, an uninstall removes it.
func TestEarlierReleaseSnippetIsManaged(t *testing.T) {
	// testdata holds manifests/containerd/nri.toml as of commit 11680bc.
	old, err := os.ReadFile(filepath.Join("testdata", "nri-previous-release.toml"))
	if err != nil {
		t.Fatal(err)
	}
	if !managed(old) {
		t.Error("the earlier release's snippet is not recognised as nvdomain's")
	}
	if managed(append(old, []byte("# an admin's edit\n")...)) {
		t.Error("an edited copy counts as nvdomain's; it must be left alone")
	}
}

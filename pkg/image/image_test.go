package image

import (
	"archive/tar"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

func moduleDir(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// instruction is one Dockerfile instruction with its continuation lines joined.
type instruction struct{ op, args string }

func parseDockerfile(t *testing.T, path string) [][]instruction {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var stages [][]instruction
	var cur strings.Builder
	flush := func() {
		line := strings.TrimSpace(cur.String())
		cur.Reset()
		if line == "" {
			return
		}
		op, args, _ := strings.Cut(line, " ")
		ins := instruction{strings.ToUpper(op), strings.TrimSpace(args)}
		if ins.op == "FROM" {
			stages = append(stages, nil)
		}
		if len(stages) == 0 {
			t.Fatalf("%s: %q before the first FROM", path, line)
		}
		stages[len(stages)-1] = append(stages[len(stages)-1], ins)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		if strings.HasSuffix(line, `\`) {
			cur.WriteString(strings.TrimSuffix(line, `\`) + " ")
			continue
		}
		cur.WriteString(line)
		flush()
	}
	flush()
	return stages
}

// TestDockerfileMatchesImage keeps manifests/image/Dockerfile equivalent to `make image`: it
// must lay out the root filesystem with the same step (RootFS, through nvdomain-image
// --rootfs, with the version, revision and time passed through), copy nothing else into a
// scratch image, and configure it as Config does: the same environment, working directory and
// labels, and no entrypoint or user.
func TestDockerfileMatchesImage(t *testing.T) {
	root := moduleDir(t)
	stages := parseDockerfile(t, filepath.Join(root, "manifests", "image", "Dockerfile"))
	if len(stages) != 2 {
		t.Fatalf("want a build stage and a final stage, got %d stages", len(stages))
	}
	build, final := stages[0], stages[1]

	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	goVersion := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
	if want := "--platform=$BUILDPLATFORM golang:" + string(goVersion[1]) + "-bookworm AS build"; build[0].args != want {
		t.Errorf("build stage FROM %q, want %q (go.mod's Go, the Debian release whose glibc the image carries)", build[0].args, want)
	}
	var rootfsRun string
	for _, ins := range build {
		if ins.op == "RUN" && strings.Contains(ins.args, "./cmd/nvdomain-image") {
			rootfsRun = ins.args
		}
	}
	for _, want := range []string{"go run ./cmd/nvdomain-image", `--version "${VERSION}"`, `--revision "${REVISION}"`, `--created "${SOURCE_DATE_EPOCH}"`, `--platforms "${TARGETPLATFORM}"`, "--rootfs /rootfs"} {
		if !strings.Contains(rootfsRun, want) {
			t.Errorf("the build stage's nvdomain-image step %q lacks %q", rootfsRun, want)
		}
	}

	if final[0].args != "scratch" {
		t.Errorf("final stage FROM %q, want scratch: make image adds no base layer", final[0].args)
	}
	env := map[string]string{}
	labels := map[string]string{}
	var copies []string
	workdir := ""
	args := map[string]string{"VERSION": "v9.9.9", "REVISION": "0123abc", "CREATED": "2026-11-30T12:00:00Z"}
	expand := func(s string) string {
		return os.Expand(s, func(k string) string { return args[k] })
	}
	pair := regexp.MustCompile(`([A-Za-z0-9_.\-]+)="([^"]*)"`)
	for _, ins := range final[1:] {
		switch ins.op {
		case "ARG":
		case "COPY":
			copies = append(copies, ins.args)
		case "ENV":
			k, v, _ := strings.Cut(ins.args, "=")
			env[k] = v
		case "WORKDIR":
			workdir = ins.args
		case "LABEL":
			for _, m := range pair.FindAllStringSubmatch(ins.args, -1) {
				labels[m[1]] = expand(m[2])
			}
		default:
			t.Errorf("final stage has %s %s: make image has no such step", ins.op, ins.args)
		}
	}
	if want := []string{"--from=build /rootfs/ /"}; !reflect.DeepEqual(copies, want) {
		t.Errorf("final stage copies %q, want only %q", copies, want)
	}
	created, _ := time.Parse(time.RFC3339, args["CREATED"])
	cfg := Config(Options{Version: args["VERSION"], Revision: args["REVISION"], Created: created})
	wantEnv := map[string]string{}
	for _, e := range cfg.Env {
		k, v, _ := strings.Cut(e, "=")
		wantEnv[k] = v
	}
	if !reflect.DeepEqual(env, wantEnv) {
		t.Errorf("ENV %v, want %v", env, wantEnv)
	}
	if workdir != cfg.WorkingDir {
		t.Errorf("WORKDIR %q, want %q", workdir, cfg.WorkingDir)
	}
	if !reflect.DeepEqual(labels, cfg.Labels) {
		t.Errorf("LABELs differ from make image's:\n got %v\nwant %v", labels, cfg.Labels)
	}
}

func TestTarDirIsReproducible(t *testing.T) {
	dir := t.TempDir()
	for p, mode := range map[string]os.FileMode{"b/x": 0o755, "a": 0o644, "b/c/y": 0o600} {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte(p), mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("x", filepath.Join(dir, "b", "l")); err != nil {
		t.Fatal(err)
	}
	at := time.Unix(1_700_000_000, 0)
	one, err := TarDir(dir, at)
	if err != nil {
		t.Fatal(err)
	}
	// Times and creation order on disk must not matter.
	if err := os.Chtimes(filepath.Join(dir, "a"), time.Now(), time.Now()); err != nil {
		t.Fatal(err)
	}
	two, err := TarDir(dir, at)
	if err != nil {
		t.Fatal(err)
	}
	if string(one) != string(two) {
		t.Fatal("two tars of one tree differ")
	}
	var got []string
	tr := tar.NewReader(strings.NewReader(string(one)))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != 0 || h.Gid != 0 || !h.ModTime.Equal(at) {
			t.Errorf("%s: owner %d:%d time %v, want 0:0 at %v", h.Name, h.Uid, h.Gid, h.ModTime, at)
		}
		got = append(got, h.Name+" "+os.FileMode(h.Mode).String()+" "+h.Linkname)
	}
	want := []string{"a -rw-r--r-- ", "b/ -rwxr-xr-x ", "b/c/ -rwxr-xr-x ", "b/c/y -rw------- ", "b/l -rwxrwxrwx x", "b/x -rwxr-xr-x "}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("tar entries:\n got %q\nwant %q", got, want)
	}
}

// TestBuildContents builds the real release image twice and checks what a node will run:
// every binary at the path the chart names, executable and reporting the version it was
// built with; the shared libraries of the cgo binaries; the NRI snippet; an SBOM that lists
// the linked Go modules and the Debian package of glibc; the labels; the same digest both
// times; and an archive that holds the image under its reference.
// loaders are where each architecture's dynamic loader sits in the image (the binaries'
// PT_INTERP), and how this machine runs that architecture's binaries: natively for its own,
// under qemu-user (Debian's qemu-user-static) for the other.
var loaders = map[string]struct{ interp, libDir, qemu string }{
	"amd64": {"lib64/ld-linux-x86-64.so.2", "lib/x86_64-linux-gnu", "qemu-x86_64-static"},
	"arm64": {"lib/ld-linux-aarch64.so.1", "lib/aarch64-linux-gnu", "qemu-aarch64-static"},
}

// TestBuildContents builds the two-platform release image as `make image` does and checks
// the index and each platform's contents: every binary, the loader and libc of its own
// architecture in its own layer, the snippet and the SBOM; then runs each platform's cgo CLI
// with only the image's files (qemu-user for the foreign one, with the image as its root, so a
// cross build that links against the wrong loader or libc cannot pass).
func TestBuildContents(t *testing.T) {
	ctx := context.Background()
	o := Options{ModuleDir: moduleDir(t), Version: "v0.0.0-test", Revision: "cafe", Created: time.Unix(1_764_000_000, 0), Log: logr.Discard(),
		Platforms: Architectures()}
	out := t.TempDir()
	res, err := Build(ctx, o, "registry.example/gpu/nvdomain:v0.0.0-test", out)
	if err != nil {
		t.Fatal(err)
	}
	again, err := Build(ctx, o, "registry.example/gpu/nvdomain:v0.0.0-test", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if res.Digest != again.Digest || !reflect.DeepEqual(res.Images, again.Images) {
		t.Errorf("two builds of one tree: index digests %s and %s, images %v and %v", res.Digest, again.Digest, res.Images, again.Images)
	}

	p, err := layout.FromPath(res.Layout)
	if err != nil {
		t.Fatal(err)
	}
	top, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	tm, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(tm.Manifests) != 1 || tm.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != res.Ref || tm.Manifests[0].Digest.String() != res.Digest ||
		tm.Manifests[0].MediaType != types.OCIImageIndex {
		t.Fatalf("layout %+v, want one image index %s named %s", tm.Manifests, res.Digest, res.Ref)
	}
	idx, err := top.ImageIndex(tm.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != len(Architectures()) {
		t.Fatalf("index has %d manifests, want one per platform %v", len(im.Manifests), Architectures())
	}
	for _, m := range im.Manifests {
		arch := m.Platform.Architecture
		t.Run(arch, func(t *testing.T) {
			if m.Platform.OS != "linux" || m.Digest.String() != res.Images[arch] {
				t.Errorf("index entry %+v, want linux/%s %s", m.Platform, arch, res.Images[arch])
			}
			img, err := idx.Image(m.Digest)
			if err != nil {
				t.Fatal(err)
			}
			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if want := Config(o); !reflect.DeepEqual(cf.Config.Labels, want.Labels) || !reflect.DeepEqual(cf.Config.Env, want.Env) || len(cf.Config.Entrypoint) != 0 {
				t.Errorf("config %+v, want %+v", cf.Config, want)
			}
			if cf.OS != "linux" || cf.Architecture != arch {
				t.Errorf("config platform %s/%s, want linux/%s", cf.OS, cf.Architecture, arch)
			}
			rootfs := t.TempDir()
			files := extract(t, img, rootfs)
			ld := loaders[arch]
			machine := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[arch]
			for _, b := range Binaries() {
				mode, ok := files[b.Name]
				if !ok || mode&0o111 == 0 {
					t.Errorf("/%s: present %v, mode %v: want an executable", b.Name, ok, mode)
					continue
				}
				f, err := elf.Open(filepath.Join(rootfs, b.Name))
				if err != nil {
					t.Fatal(err)
				}
				if f.Machine != machine {
					t.Errorf("/%s is built for %v, want %v", b.Name, f.Machine, machine)
				}
				f.Close()
			}
			want := []string{ld.interp, ld.libDir + "/libc.so.6", NRISnippetPath, SBOMPath}
			for _, l := range nvmlNeeds {
				want = append(want, ld.libDir+"/"+l)
			}
			for _, f := range want {
				if _, ok := files[f]; !ok {
					t.Errorf("/%s missing from the image; it has %v", f, keys(files))
				}
			}
			for other, l := range loaders {
				if _, ok := files[l.libDir+"/libc.so.6"]; ok && other != arch {
					t.Errorf("the %s image carries %s's libc", arch, other)
				}
			}
			// The cgo CLI runs with the image's own loader and libc, as it will in a container.
			var cmd *exec.Cmd
			if arch == runtime.GOARCH {
				cmd = exec.Command(filepath.Join(rootfs, ld.interp), "--library-path", filepath.Join(rootfs, ld.libDir), filepath.Join(rootfs, "nvdomain"), "version")
			} else {
				qemu, err := exec.LookPath(ld.qemu)
				if err != nil {
					t.Fatalf("running the %s binaries needs %s (Debian: apt-get install qemu-user-static; make cross-deps installs it): %v", arch, ld.qemu, err)
				}
				// -L: the loader and every library come from the image's root, at the paths
				// the loader searches by default.
				cmd = exec.Command(qemu, "-L", rootfs, filepath.Join(rootfs, "nvdomain"), "version")
			}
			ver, err := cmd.CombinedOutput()
			if err != nil || strings.TrimSpace(string(ver)) != o.Version {
				t.Errorf("/nvdomain version on %s: %q (%v), want %q", arch, ver, err, o.Version)
			}
			checkSBOM(t, rootfs, o.Version)
		})
	}

	ref, err := tarball.ImageFromPath(res.Archive, nil)
	if err != nil {
		t.Fatalf("archive: %v", err)
	}
	// The archive is docker-save shaped (its manifest is rebuilt on load) and holds this
	// machine's platform, so compare what defines the image: its configuration.
	cf, err := ref.ConfigFile()
	if err != nil || cf.Architecture != runtime.GOARCH {
		t.Errorf("archive: %v, architecture %v, want %s", err, cf, runtime.GOARCH)
	}
	native, err := idx.Image(mustHash(t, res.Images[runtime.GOARCH]))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := ref.ConfigName()
	want, _ := native.ConfigName()
	if got != want {
		t.Errorf("archive holds config %s, want %s", got, want)
	}
}

func mustHash(t *testing.T, s string) v1.Hash {
	t.Helper()
	h, err := v1.NewHash(s)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func checkSBOM(t *testing.T, rootfs, version string) {
	t.Helper()
	var sbom struct {
		SPDXVersion string `json:"spdxVersion"`
		Packages    []struct {
			Name        string `json:"name"`
			VersionInfo string `json:"versionInfo"`
		} `json:"packages"`
	}
	data, err := os.ReadFile(filepath.Join(rootfs, SBOMPath))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &sbom); err != nil {
		t.Fatalf("SBOM: %v", err)
	}
	names := map[string]string{}
	for _, p := range sbom.Packages {
		names[p.Name] = p.VersionInfo
	}
	if sbom.SPDXVersion != "SPDX-2.3" || names["nvdomain"] != version || names["k8s.io/client-go"] == "" || names["github.com/NVIDIA/go-nvml"] == "" {
		t.Errorf("SBOM %s lacks nvdomain %s, client-go or go-nvml: %v", sbom.SPDXVersion, version, names)
	}
	if _, err := exec.LookPath("dpkg"); err == nil && names["libc6"] == "" && !strings.HasPrefix(firstKeyWithPrefix(names, "libc6-"), "libc6-") {
		t.Errorf("SBOM lacks the Debian package of glibc (libc6, or libc6-<arch>-cross): %v", names)
	}
}

func firstKeyWithPrefix(m map[string]string, prefix string) string {
	for k := range m {
		if strings.HasPrefix(k, prefix) {
			return k
		}
	}
	return ""
}

func extract(t *testing.T, img v1.Image, dir string) map[string]os.FileMode {
	t.Helper()
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %d, %v; want one", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	files := map[string]os.FileMode{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		files[h.Name] = os.FileMode(h.Mode)
		p := filepath.Join(dir, h.Name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, os.FileMode(h.Mode)); err != nil {
			t.Fatal(err)
		}
	}
}

func keys(m map[string]os.FileMode) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

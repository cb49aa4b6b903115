// Package image builds nvdomain's release image without a Docker engine: it compiles the
// five binaries (the static webhook and OCI hook, the cgo agent, NRI plugin and CLI with the
// shared libraries they load), lays out the root filesystem with the containerd NRI snippet
// and an SPDX SBOM, and writes one deterministic layer as an OCI image layout and as an
// archive `ctr images import` and `docker load` accept. manifests/image/Dockerfile runs the
// same root-filesystem step, so the two ways of building give the same image
// (TestDockerfileMatchesImage).
package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/nvdomain/nvdomain/pkg/version"
)

// DefaultRepository is where the chart pulls the image from (charts/nvdomain/values.yaml).
const DefaultRepository = "ghcr.io/nvdomain/nvdomain"

// Paths inside the image that other parts of the project rely on: the chart's commands and
// the Dockerfile name them.
const (
	// NRISnippetPath is containerd's NRI configuration the node's enable-nri step installs.
	NRISnippetPath = "etc/nvdomain/containerd-nri.toml"
	// SBOMPath is the SPDX 2.3 document describing every file of the image.
	SBOMPath = "sbom.spdx.json"
)

// OCI label keys the image carries.
const (
	LabelTitle       = "org.opencontainers.image.title"
	LabelDescription = "org.opencontainers.image.description"
	LabelSource      = "org.opencontainers.image.source"
	LabelVersion     = "org.opencontainers.image.version"
	LabelRevision    = "org.opencontainers.image.revision"
	LabelCreated     = "org.opencontainers.image.created"
	// LabelSBOM names the SBOM's path in the image, for scanners.
	LabelSBOM = "dev.nvdomain.sbom"
)

// Binary is one program of the image, installed at /<Name>.
type Binary struct {
	Name    string
	Package string
	// CGO is set for binaries that load libnvidia-ml with dlopen through go-nvml; their
	// shared libraries (glibc and its loader) go into the image with them.
	CGO bool
}

// Binaries are the image's programs; the chart runs them by these paths.
func Binaries() []Binary {
	return []Binary{
		{Name: "nvdomain-webhook", Package: "./cmd/nvdomain-webhook"},
		{Name: "nvdomain-agent", Package: "./cmd/nvdomain-agent", CGO: true},
		{Name: "nvdomain-nri", Package: "./cmd/nvdomain-nri", CGO: true},
		{Name: "nvdomain", Package: "./cmd/nvdomain", CGO: true},
		{Name: "nvdomain-nri-hook", Package: "./cmd/nvdomain-nri-hook"},
	}
}

// Options say what to build.
type Options struct {
	// ModuleDir is the repository's root.
	ModuleDir string
	// Version and Revision (the commit) are linked into every binary and recorded as labels.
	Version  string
	Revision string
	// Created is the image's creation time and every file's modification time: the commit's
	// time, so two builds of one commit give one digest.
	Created time.Time
	// Go is the go command; "go" when empty.
	Go  string
	Log logr.Logger
}

func (o Options) goCmd() string {
	if o.Go == "" {
		return "go"
	}
	return o.Go
}

// Config is the image's runtime configuration: no entrypoint (the chart names the binary of
// each container), PATH for the CLI, and the labels.
func Config(o Options) v1.Config {
	return v1.Config{
		Env: []string{"PATH=/"},
		Labels: map[string]string{
			LabelTitle:       "nvdomain",
			LabelDescription: "Places tensor-parallel GPU pods inside one NVSwitch/NVLink domain: admission webhook, node agent, NRI plugin and OCI hook",
			LabelSource:      "https://github.com/nvdomain/nvdomain",
			LabelVersion:     o.Version,
			LabelRevision:    o.Revision,
			LabelCreated:     o.Created.UTC().Format(time.RFC3339),
			LabelSBOM:        "/" + SBOMPath,
		},
		WorkingDir: "/",
	}
}

// RootFS lays the image's root filesystem out in dir (which must be empty or absent): the
// binaries, the shared libraries the cgo ones load, the NRI snippet and the SBOM.
func RootFS(ctx context.Context, o Options, dir string) error {
	if o.Version == "" {
		return fmt.Errorf("image: Version is empty: pass --version (make image sets it from git describe)")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("image: create %s: %w", dir, err)
	}
	var sbom sbomBuilder
	libs := map[string]bool{}
	for _, b := range Binaries() {
		path := filepath.Join(dir, b.Name)
		if err := o.build(ctx, b, path); err != nil {
			return err
		}
		if err := sbom.addBinary(b.Name, path); err != nil {
			return err
		}
		if !b.CGO {
			continue
		}
		deps, err := sharedLibs(ctx, path)
		if err != nil {
			return err
		}
		for _, l := range deps {
			libs[l] = true
		}
	}
	for _, lib := range sortedKeys(libs) {
		real, err := filepath.EvalSymlinks(lib)
		if err != nil {
			return fmt.Errorf("image: resolve %s: %w", lib, err)
		}
		if err := copyFile(real, filepath.Join(dir, strings.TrimPrefix(lib, "/")), 0o755); err != nil {
			return err
		}
		sbom.addHostFile(ctx, lib)
	}
	if err := copyFile(filepath.Join(o.ModuleDir, "manifests", "containerd", "nri.toml"), filepath.Join(dir, NRISnippetPath), 0o644); err != nil {
		return err
	}
	doc, err := sbom.document(o)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, SBOMPath), doc, 0o644); err != nil {
		return fmt.Errorf("image: write SBOM: %w", err)
	}
	return nil
}

func (o Options) build(ctx context.Context, b Binary, out string) error {
	ldflags := "-s -w " + version.LinkerFlag(o.Version)
	cmd := exec.CommandContext(ctx, o.goCmd(), "build", "-trimpath", "-buildvcs=false", "-ldflags", ldflags, "-o", out, b.Package)
	cmd.Dir = o.ModuleDir
	cmd.Env = append(os.Environ(), "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
	if b.CGO {
		cmd.Env = append(cmd.Env, "CGO_ENABLED=1")
	} else {
		cmd.Env = append(cmd.Env, "CGO_ENABLED=0")
	}
	o.Log.V(1).Info("go build", "package", b.Package, "cgo", b.CGO)
	if msg, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("image: go build %s: %w\n%s", b.Package, err, msg)
	}
	return nil
}

// sharedLibs lists the shared libraries (with the dynamic loader) a binary needs, as ldd
// resolves them on the build machine.
func sharedLibs(ctx context.Context, bin string) ([]string, error) {
	out, err := exec.CommandContext(ctx, "ldd", bin).CombinedOutput()
	if err != nil {
		if bytes.Contains(out, []byte("not a dynamic executable")) {
			return nil, nil
		}
		return nil, fmt.Errorf("image: ldd %s: %w: %s (install libc-bin)", bin, err, out)
	}
	var libs []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		for _, w := range strings.Fields(sc.Text()) {
			if strings.HasPrefix(w, "/") {
				libs = append(libs, w)
				break
			}
		}
	}
	return libs, nil
}

func copyFile(src, dst string, mode fs.FileMode) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return fmt.Errorf("image: read %s: %w", src, err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("image: create %s: %w", filepath.Dir(dst), err)
	}
	if err := os.WriteFile(dst, data, mode); err != nil {
		return fmt.Errorf("image: write %s: %w", dst, err)
	}
	return nil
}

// Result is what Build wrote.
type Result struct {
	Ref string
	// Digest is the image manifest's digest, the same for two builds of one commit.
	Digest string
	// Layout is the OCI image layout directory; Archive the single-file archive for
	// `ctr -n k8s.io images import` or `docker load`.
	Layout  string
	Archive string
}

// Build builds the image named ref into outDir: outDir/<tag>/ (OCI layout) and
// outDir/nvdomain-<tag>.tar.
func Build(ctx context.Context, o Options, ref string, outDir string) (Result, error) {
	tag, err := name.NewTag(ref)
	if err != nil {
		return Result{}, fmt.Errorf("image: reference %q: %w (use repository:tag)", ref, err)
	}
	work, err := os.MkdirTemp(outDir, ".rootfs-")
	if err != nil {
		if err := os.MkdirAll(outDir, 0o755); err != nil {
			return Result{}, fmt.Errorf("image: create %s: %w", outDir, err)
		}
		if work, err = os.MkdirTemp(outDir, ".rootfs-"); err != nil {
			return Result{}, fmt.Errorf("image: temporary directory in %s: %w", outDir, err)
		}
	}
	defer os.RemoveAll(work)
	if err := RootFS(ctx, o, work); err != nil {
		return Result{}, err
	}
	img, err := Assemble(work, Config(o), o.Created)
	if err != nil {
		return Result{}, err
	}
	digest, err := img.Digest()
	if err != nil {
		return Result{}, fmt.Errorf("image: digest: %w", err)
	}
	res := Result{
		Ref:     tag.String(),
		Digest:  digest.String(),
		Layout:  filepath.Join(outDir, tag.TagStr()),
		Archive: filepath.Join(outDir, "nvdomain-"+tag.TagStr()+".tar"),
	}
	if err := os.RemoveAll(res.Layout); err != nil {
		return Result{}, fmt.Errorf("image: clear %s: %w", res.Layout, err)
	}
	p, err := layout.Write(res.Layout, empty.Index)
	if err != nil {
		return Result{}, fmt.Errorf("image: OCI layout %s: %w", res.Layout, err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": tag.String(),
		"io.containerd.image.name":          tag.String(),
	})); err != nil {
		return Result{}, fmt.Errorf("image: write OCI layout: %w", err)
	}
	if err := tarball.WriteToFile(res.Archive, tag, img); err != nil {
		return Result{}, fmt.Errorf("image: write archive %s: %w", res.Archive, err)
	}
	return res, nil
}

// Assemble makes the single-layer OCI image of the root filesystem in dir.
func Assemble(dir string, cfg v1.Config, created time.Time) (v1.Image, error) {
	layerTar, err := TarDir(dir, created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
	if err != nil {
		return nil, fmt.Errorf("image: layer: %w", err)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.AppendLayers(img, layer)
	if err != nil {
		return nil, fmt.Errorf("image: append layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image: config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = "amd64", "linux"
	cf.Config = cfg
	cf.Created = v1.Time{Time: created.UTC()}
	cf.History = []v1.History{{Created: v1.Time{Time: created.UTC()}, CreatedBy: "nvdomain-image " + cfg.Labels[LabelVersion]}}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("image: set config: %w", err)
	}
	return img, nil
}

// TarDir writes dir as a reproducible tar: sorted names, root-owned, every time set to
// created, modes kept, directories listed before their contents.
func TarDir(dir string, created time.Time) ([]byte, error) {
	var paths []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir {
			paths = append(paths, p)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("image: walk %s: %w", dir, err)
	}
	sort.Strings(paths)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		fi, err := os.Lstat(p)
		if err != nil {
			return nil, fmt.Errorf("image: %w", err)
		}
		rel, _ := filepath.Rel(dir, p)
		hdr := &tar.Header{Name: filepath.ToSlash(rel), ModTime: created.UTC(), Mode: int64(fi.Mode().Perm()), Format: tar.FormatPAX}
		switch {
		case fi.IsDir():
			hdr.Typeflag, hdr.Name = tar.TypeDir, hdr.Name+"/"
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return nil, fmt.Errorf("image: %w", err)
			}
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
		case fi.Mode().IsRegular():
			hdr.Typeflag, hdr.Size = tar.TypeReg, fi.Size()
		default:
			return nil, fmt.Errorf("image: %s is neither a file, a directory nor a link", p)
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("image: tar %s: %w", rel, err)
		}
		if hdr.Typeflag == tar.TypeReg {
			data, err := os.ReadFile(p)
			if err != nil {
				return nil, fmt.Errorf("image: %w", err)
			}
			if _, err := tw.Write(data); err != nil {
				return nil, fmt.Errorf("image: tar %s: %w", rel, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("image: tar: %w", err)
	}
	return buf.Bytes(), nil
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Package image builds nvdomain's release image without a Docker engine: for each platform
// (linux/amd64, and linux/arm64 for Grace nodes, cross-built) it compiles the five binaries
// (the static webhook and OCI hook, the cgo agent, NRI plugin and CLI with the loader and
// shared libraries of their architecture), lays out the root filesystem with the containerd
// NRI snippet and an SPDX SBOM, and makes one deterministic layer; the platforms' images go
// into one index, written as an OCI image layout, and this machine's image as an archive
// `ctr images import` and `docker load` accept. manifests/image/Dockerfile runs the
// same root-filesystem step, so the two ways of building give the same image
// (TestDockerfileMatchesImage).
package image

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
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
	// Arch is the GOARCH RootFS builds for ("" is this machine's); Build sets it per platform.
	Arch string
	// Platforms Build writes into one image index: architectures of linux, "amd64" and
	// "arm64"; empty is this machine's only.
	Platforms []string
}

// platform is how to build for one architecture on this machine: natively, or with Debian's
// cross C toolchain (gcc-aarch64-linux-gnu, libc6-dev-arm64-cross) for the cgo binaries.
type platform struct {
	arch string
	// cc is the C compiler for cgo; "" uses the Go default (the native gcc).
	cc string
	// libDirs are searched, in order, for the shared libraries a binary names.
	libDirs []string
	// imageLibDir is where those libraries go in the image: Debian's multiarch directory,
	// which the architecture's dynamic loader searches by default.
	imageLibDir string
}

// multiarch is Debian's multiarch triplet of each architecture the image is built for.
var multiarch = map[string]string{"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}

// Architectures are the architectures an image can be built for.
func Architectures() []string { return []string{"amd64", "arm64"} }

func platformFor(arch string) (platform, error) {
	if arch == "" {
		arch = runtime.GOARCH
	}
	triplet, ok := multiarch[arch]
	if !ok {
		return platform{}, fmt.Errorf("image: architecture %q: use one of %v", arch, Architectures())
	}
	p := platform{arch: arch, imageLibDir: "lib/" + triplet}
	if arch == runtime.GOARCH {
		p.libDirs = []string{"/lib/" + triplet, "/usr/lib/" + triplet, "/lib64", "/lib"}
		return p, nil
	}
	p.cc = triplet + "-gcc"
	p.libDirs = []string{"/usr/" + triplet + "/lib"}
	if _, err := exec.LookPath(p.cc); err != nil {
		return p, fmt.Errorf("image: building for %s needs the cross C compiler %s and its C library (Debian: apt-get install gcc-%s libc6-dev-%s-cross): %w", arch, p.cc, strings.ReplaceAll(triplet, "_", "-"), arch, err)
	}
	return p, nil
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
	plat, err := platformFor(o.Arch)
	if err != nil {
		return err
	}
	var sbom sbomBuilder
	libs := map[string]string{} // path in the image -> file on this machine
	if err := o.buildAll(ctx, plat, dir); err != nil {
		return err
	}
	for _, b := range Binaries() {
		path := filepath.Join(dir, b.Name)
		if err := sbom.addBinary(b.Name, path); err != nil {
			return err
		}
		if !b.CGO {
			// The hook runs on the host (runc), whose libc is unknown: it must stay static.
			if interp, err := interpreter(path); err != nil || interp != "" {
				return fmt.Errorf("image: %s must be a static binary (the hook runs on the host, the webhook needs no libraries), but it names the loader %q (%v): a package it imports now uses cgo, or GOFLAGS asks for a dynamic build", b.Name, interp, err)
			}
			continue
		}
		if err := sharedLibs(path, plat, libs); err != nil {
			return err
		}
		// libnvidia-ml, which these binaries dlopen, names glibc's compatibility libraries
		// (libpthread, libdl, librt, libm) that the Go binaries themselves do not; the NVIDIA
		// toolkit mounts only the driver's own libraries, so the image must carry them.
		if err := addLibs("libnvidia-ml", nvmlNeeds, plat, libs); err != nil {
			return err
		}
	}
	for _, in := range sortedKeys(libs) {
		host := libs[in]
		real, err := filepath.EvalSymlinks(host)
		if err != nil {
			return fmt.Errorf("image: resolve %s: %w", host, err)
		}
		if err := copyFile(real, filepath.Join(dir, in), 0o755); err != nil {
			return err
		}
		sbom.addHostFile(ctx, host, in)
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

// buildAll builds every binary of the image into dir with one go build. One invocation with
// one configuration compiles each shared package once (the webhook, the CLI and the agent share
// most of client-go) and links the binaries side by side: cgo on, for go-nvml, and the pure-Go
// resolver and user lookup (netgo, osusergo), so a binary that imports no cgo package links
// internally into a static executable, as the hook must be (RootFS checks it).
func (o Options) buildAll(ctx context.Context, plat platform, dir string) error {
	ldflags := "-s -w " + version.LinkerFlag(o.Version)
	// -o dir/ names each binary after its package's directory, which is each Binary's Name.
	args := []string{"build", "-trimpath", "-buildvcs=false", "-tags", BuildTags, "-ldflags", ldflags, "-o", dir + string(filepath.Separator)}
	for _, b := range Binaries() {
		args = append(args, b.Package)
	}
	cmd := exec.CommandContext(ctx, o.goCmd(), args...)
	cmd.Dir = o.ModuleDir
	cmd.Env = append(os.Environ(), "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations", "GOOS=linux", "GOARCH="+plat.arch, "CGO_ENABLED=1")
	if plat.cc != "" {
		cmd.Env = append(cmd.Env, "CC="+plat.cc)
	}
	o.Log.V(1).Info("go build", "arch", plat.arch)
	if msg, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("image: go build for %s: %w\n%s", plat.arch, err, msg)
	}
	return nil
}

// BuildTags are the build tags of the image's binaries (buildAll); a build that wants to share
// their compiled packages (the demo's) uses the same.
const BuildTags = "netgo,osusergo"

// interpreter is the ELF loader a binary names (PT_INTERP), "" for a static one.
func interpreter(bin string) (string, error) {
	f, err := elf.Open(bin)
	if err != nil {
		return "", fmt.Errorf("image: read %s: %w", bin, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err != nil {
				return "", fmt.Errorf("image: read %s's loader: %w", bin, err)
			}
			return strings.TrimRight(string(b), "\x00"), nil
		}
	}
	return "", nil
}

// sharedLibs adds to libs the dynamic loader and the shared libraries a binary needs, and
// theirs, read from the ELF file itself (so it works for another architecture's binary, which
// ldd cannot run): the loader at the path the binary names (PT_INTERP), each library in the
// image's multiarch directory, each found in the platform's library directories.
func sharedLibs(bin string, plat platform, libs map[string]string) error {
	f, err := elf.Open(bin)
	if err != nil {
		return fmt.Errorf("image: read %s: %w", bin, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		b, err := io.ReadAll(p.Open())
		if err != nil {
			return fmt.Errorf("image: %s's interpreter: %w", bin, err)
		}
		interp := strings.TrimRight(string(b), "\x00")
		host, err := findLib(filepath.Base(interp), plat)
		if err != nil {
			return fmt.Errorf("image: %s's loader %s: %w", bin, interp, err)
		}
		libs[strings.TrimPrefix(interp, "/")] = host
	}
	needed, err := f.ImportedLibraries()
	if err != nil {
		return fmt.Errorf("image: %s's libraries: %w", bin, err)
	}
	return addLibs(bin, needed, plat, libs)
}

// addLibs adds the libraries names (those who needs) to libs, each with its own.
func addLibs(who string, names []string, plat platform, libs map[string]string) error {
	for _, name := range names {
		in := filepath.Join(plat.imageLibDir, name)
		if _, ok := libs[in]; ok {
			continue
		}
		host, err := findLib(name, plat)
		if err != nil {
			return fmt.Errorf("image: %s needs %s: %w", who, name, err)
		}
		libs[in] = host
		if err := sharedLibs(host, plat, libs); err != nil {
			return err
		}
	}
	return nil
}

// nvmlNeeds are the glibc libraries libnvidia-ml.so.1 is linked against, besides libc.
var nvmlNeeds = []string{"libpthread.so.0", "libdl.so.2", "librt.so.1", "libm.so.6"}

// elfMachine is each architecture's ELF machine: a library of another architecture found in a
// search directory (a multilib path) is skipped, not copied.
var elfMachine = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

func findLib(name string, plat platform) (string, error) {
	for _, d := range plat.libDirs {
		p := filepath.Join(d, name)
		f, err := elf.Open(p)
		if err != nil {
			continue
		}
		m := f.Machine
		f.Close()
		if m == elfMachine[plat.arch] {
			return p, nil
		}
	}
	return "", fmt.Errorf("not found in %s (for %s, install Debian's libc6%s)", strings.Join(plat.libDirs, ", "), plat.arch, map[bool]string{true: "", false: "-dev-" + plat.arch + "-cross"}[plat.cc == ""])
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
	// Digest is the image index's digest (one manifest per platform), the same for two builds
	// of one commit; Images is each platform's image manifest digest, by architecture.
	Digest string
	Images map[string]string
	// Layout is the OCI image layout directory holding the index (`crane push`,
	// `skopeo copy --all oci:`); Archive the single-platform archive, of this machine's
	// architecture when it was built, for `ctr -n k8s.io images import` or `docker load`.
	Layout  string
	Archive string
}

// Build builds the image named ref for o.Platforms into outDir: outDir/<tag>/ (an OCI layout
// whose index holds every platform) and outDir/nvdomain-<tag>.tar.
func Build(ctx context.Context, o Options, ref string, outDir string) (Result, error) {
	tag, err := name.NewTag(ref)
	if err != nil {
		return Result{}, fmt.Errorf("image: reference %q: %w (use repository:tag)", ref, err)
	}
	// Sorted and unique: the index's digest must not depend on how --platforms was written.
	archs := slices.Compact(slices.Sorted(slices.Values(o.Platforms)))
	if len(archs) == 0 {
		archs = []string{runtime.GOARCH}
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return Result{}, fmt.Errorf("image: create %s: %w", outDir, err)
	}
	res := Result{
		Ref:     tag.String(),
		Images:  map[string]string{},
		Layout:  filepath.Join(outDir, tag.TagStr()),
		Archive: filepath.Join(outDir, "nvdomain-"+tag.TagStr()+".tar"),
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	var archived v1.Image
	for _, arch := range archs {
		img, err := buildOne(ctx, o, arch, outDir)
		if err != nil {
			return Result{}, err
		}
		digest, err := img.Digest()
		if err != nil {
			return Result{}, fmt.Errorf("image: digest: %w", err)
		}
		res.Images[arch] = digest.String()
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}}})
		if archived == nil || arch == runtime.GOARCH {
			archived = img
		}
	}
	digest, err := idx.Digest()
	if err != nil {
		return Result{}, fmt.Errorf("image: index digest: %w", err)
	}
	res.Digest = digest.String()
	if err := os.RemoveAll(res.Layout); err != nil {
		return Result{}, fmt.Errorf("image: clear %s: %w", res.Layout, err)
	}
	p, err := layout.Write(res.Layout, empty.Index)
	if err != nil {
		return Result{}, fmt.Errorf("image: OCI layout %s: %w", res.Layout, err)
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": tag.String(),
		"io.containerd.image.name":          tag.String(),
	})); err != nil {
		return Result{}, fmt.Errorf("image: write OCI layout: %w", err)
	}
	if err := tarball.WriteToFile(res.Archive, tag, archived); err != nil {
		return Result{}, fmt.Errorf("image: write archive %s: %w", res.Archive, err)
	}
	return res, nil
}

// buildOne builds the image of one architecture.
func buildOne(ctx context.Context, o Options, arch, outDir string) (v1.Image, error) {
	work, err := os.MkdirTemp(outDir, ".rootfs-"+arch+"-")
	if err != nil {
		return nil, fmt.Errorf("image: temporary directory in %s: %w", outDir, err)
	}
	defer os.RemoveAll(work)
	o.Arch = arch
	if err := RootFS(ctx, o, work); err != nil {
		return nil, err
	}
	return Assemble(work, Config(o), o.Created, arch)
}

// Assemble makes the single-layer OCI image of the root filesystem in dir.
func Assemble(dir string, cfg v1.Config, created time.Time, arch string) (v1.Image, error) {
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
	cf.Architecture, cf.OS = arch, "linux"
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

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

package localcluster

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/go-logr/logr"

	"github.com/nvdomain/nvdomain/pkg/image"
	"github.com/nvdomain/nvdomain/pkg/names"
	"github.com/nvdomain/nvdomain/test/ocitest"
)

// Images the cluster imports; nothing is ever pulled. nvdomain itself runs from the release
// image `make image` builds (ReleaseImage); the harness's own binaries (a pause process, a
// busybox shell for test pods) come in images of their own.
const (
	BusyboxImage = "docker.io/library/busybox:nvdomain"
	PauseImage   = "registry.k8s.io/pause:nvdomain"
	// CUDAImage is the busybox shell with the environment NVIDIA's CUDA base images set
	// (nvidia/cuda's Dockerfiles): every GPU, unless something on the node says otherwise.
	CUDAImage = "docker.io/nvidia/cuda:nvdomain"
)

// Environment variables through which `make demo` and `make e2e` hand over the image `make
// image` built (its archive and reference), so the cluster installs exactly that image.
const (
	EnvImageArchive = "NVDOMAIN_IMAGE_ARCHIVE"
	EnvImageRef     = "NVDOMAIN_IMAGE"
)

// ReleaseImage is the release image the cluster installs: the one named by EnvImageArchive
// and EnvImageRef when set, else one built here with the same code as `make image`, tagged
// with `git describe` as the Makefile does.
func (c *Cluster) ReleaseImage(ctx context.Context) (image.Result, error) {
	if archive, ref := os.Getenv(EnvImageArchive), os.Getenv(EnvImageRef); archive != "" && ref != "" {
		return image.Result{Ref: ref, Archive: archive}, nil
	}
	version := "dev"
	if out, err := exec.CommandContext(ctx, "git", "-C", c.Root, "describe", "--tags", "--always", "--dirty").Output(); err == nil {
		version = strings.TrimSpace(string(out))
	}
	return c.BuildImage(ctx, version)
}

// BuildImage builds the release image at version into the cluster's work directory.
func (c *Cluster) BuildImage(ctx context.Context, version string) (image.Result, error) {
	o := image.Options{ModuleDir: c.Root, Version: version, Revision: "local", Log: logr.Discard()}
	return image.Build(ctx, o, image.DefaultRepository+":"+version, c.path("images"))
}

// ImportImage imports an image archive into the node's containerd.
func (c *Cluster) ImportImage(archive string) error {
	if out, err := exec.Command(filepath.Join(c.CtrdBin, "ctr"), "--address", c.path("c.sock"), "-n", "k8s.io", "images", "import", archive).CombinedOutput(); err != nil {
		return fmt.Errorf("import %s: %v\n%s", archive, err, out)
	}
	return nil
}

// ImageTag and ImageRepository split an image reference repository:tag.
func ImageTag(ref string) string { return ref[strings.LastIndex(ref, ":")+1:] }

// ImageRepository: see ImageTag.
func ImageRepository(ref string) string { return ref[:strings.LastIndex(ref, ":")] }

// buildPause builds the harness's pause process.
func (c *Cluster) buildPause() (string, error) {
	path := c.path("images", "bin", "pause")
	cmd := exec.Command("go", "build", "-trimpath", "-o", path, "./test/images/pause")
	cmd.Dir = c.Root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./test/images/pause: %v\n%s", err, msg)
	}
	return path, nil
}

func busyboxFiles() map[string]ocitest.File {
	files := map[string]ocitest.File{"bin/busybox": {Source: "/bin/busybox"}}
	for _, applet := range []string{"sh", "env", "sleep", "cat", "echo", "cp", "ls", "true", "date"} {
		files["bin/"+applet] = ocitest.File{Link: "busybox"}
	}
	return files
}

func (c *Cluster) importImages(ctx context.Context) error {
	if out, _ := exec.Command("ldd", "/bin/busybox").CombinedOutput(); !bytes.Contains(out, []byte("not a dynamic executable")) {
		return fmt.Errorf("/bin/busybox is missing or not static: apt-get install busybox-static")
	}
	pauseBin, err := c.buildPause()
	if err != nil {
		return err
	}
	release, err := c.ReleaseImage(ctx)
	if err != nil {
		return err
	}
	c.Image, c.ReleaseArchive = release.Ref, release.Archive
	if !c.o.PullReleaseImage {
		if err := c.ImportImage(release.Archive); err != nil {
			return err
		}
	}
	busybox := ocitest.Image{Ref: BusyboxImage, Files: busyboxFiles(), Env: []string{"PATH=/bin"}, Entrypoint: []string{"/bin/sh"}}
	pause := ocitest.Image{Ref: PauseImage, Files: map[string]ocitest.File{"pause": {Source: pauseBin}}, Entrypoint: []string{"/pause"}}
	cuda := ocitest.Image{Ref: CUDAImage, Files: busyboxFiles(), Entrypoint: []string{"/bin/sh"},
		Env: []string{"PATH=/bin", names.VisibleDevicesEnv + "=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"}}
	for _, img := range []ocitest.Image{busybox, pause, cuda} {
		tarPath := c.path("images", strings.NewReplacer("/", "_", ":", "_").Replace(img.Ref)+".tar")
		if err := ocitest.WriteArchive(img, tarPath); err != nil {
			return err
		}
		if err := c.ImportImage(tarPath); err != nil {
			return err
		}
	}
	return nil
}

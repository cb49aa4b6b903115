package localcluster

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/nvdomain/nvdomain/test/ocitest"
)

// Images the cluster imports; nothing is ever pulled.
const (
	NvdomainImage = "docker.io/nvdomain/nvdomain:dev"
	BusyboxImage  = "docker.io/library/busybox:nvdomain"
	PauseImage    = "registry.k8s.io/pause:nvdomain"
)

// buildBinaries builds the project's binaries for the image. The webhook is static; the
// agent and the NRI plugin use cgo (go-nvml loads libnvidia-ml at run time), so their shared
// libraries go into the image too.
func (c *Cluster) buildBinaries() (map[string]string, error) {
	out := map[string]string{}
	dir := c.path("images", "bin")
	for _, b := range []struct {
		name string
		pkg  string
		cgo  bool
	}{
		{"nvdomain-webhook", "./cmd/nvdomain-webhook", false},
		{"nvdomain-agent", "./cmd/nvdomain-agent", true},
		{"nvdomain-nri", "./cmd/nvdomain-nri", true},
		{"nvdomain", "./cmd/nvdomain", true},
		{"nvdomain-nri-hook", "./cmd/nvdomain-nri-hook", false},
		{"pause", "./test/images/pause", false},
	} {
		path := filepath.Join(dir, b.name)
		cmd := exec.Command("go", "build", "-trimpath", "-o", path, b.pkg)
		cmd.Dir = c.Root
		cmd.Env = append(os.Environ(), "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
		if !b.cgo {
			cmd.Env = append(cmd.Env, "CGO_ENABLED=0")
		}
		if msg, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("go build %s: %v\n%s", b.pkg, err, msg)
		}
		out[b.name] = path
	}
	return out, nil
}

// sharedLibs lists the shared libraries a binary loads, with the dynamic loader.
func sharedLibs(bin string) ([]string, error) {
	out, err := exec.Command("ldd", bin).CombinedOutput()
	if err != nil {
		if bytes.Contains(out, []byte("not a dynamic executable")) {
			return nil, nil
		}
		return nil, fmt.Errorf("ldd %s: %w", bin, err)
	}
	var libs []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		for _, w := range f {
			if strings.HasPrefix(w, "/") {
				libs = append(libs, w)
				break
			}
		}
	}
	return libs, nil
}

func busyboxFiles() map[string]ocitest.File {
	files := map[string]ocitest.File{"bin/busybox": {Source: "/bin/busybox"}}
	for _, applet := range []string{"sh", "env", "sleep", "cat", "echo", "cp", "ls", "true", "date"} {
		files["bin/"+applet] = ocitest.File{Link: "busybox"}
	}
	return files
}

func (c *Cluster) importImages() error {
	if out, _ := exec.Command("ldd", "/bin/busybox").CombinedOutput(); !bytes.Contains(out, []byte("not a dynamic executable")) {
		return fmt.Errorf("/bin/busybox is missing or not static: apt-get install busybox-static")
	}
	bins, err := c.buildBinaries()
	if err != nil {
		return err
	}
	nv := ocitest.Image{Ref: NvdomainImage, Files: busyboxFiles(), Env: []string{"PATH=/bin"}}
	for _, name := range []string{"nvdomain-webhook", "nvdomain-agent", "nvdomain-nri", "nvdomain", "nvdomain-nri-hook"} {
		nv.Files[name] = ocitest.File{Source: bins[name]}
		libs, err := sharedLibs(bins[name])
		if err != nil {
			return err
		}
		for _, lib := range libs {
			real, err := filepath.EvalSymlinks(lib)
			if err != nil {
				return err
			}
			nv.Files[strings.TrimPrefix(lib, "/")] = ocitest.File{Source: real}
		}
	}
	nv.Files["etc/nvdomain/containerd-nri.toml"] = ocitest.File{Source: filepath.Join(c.Root, "manifests", "containerd", "nri.toml"), Mode: 0o644}
	busybox := ocitest.Image{Ref: BusyboxImage, Files: busyboxFiles(), Env: []string{"PATH=/bin"}, Entrypoint: []string{"/bin/sh"}}
	pause := ocitest.Image{Ref: PauseImage, Files: map[string]ocitest.File{"pause": {Source: bins["pause"]}}, Entrypoint: []string{"/pause"}}
	for _, img := range []ocitest.Image{nv, busybox, pause} {
		tarPath := c.path("images", strings.NewReplacer("/", "_", ":", "_").Replace(img.Ref)+".tar")
		if err := ocitest.WriteArchive(img, tarPath); err != nil {
			return err
		}
		if out, err := exec.Command(filepath.Join(c.CtrdBin, "ctr"), "--address", c.path("c.sock"), "-n", "k8s.io", "images", "import", tarPath).CombinedOutput(); err != nil {
			return fmt.Errorf("import %s: %v\n%s", img.Ref, err, out)
		}
	}
	return nil
}

// Package hostfiles installs and removes the files nvdomain puts on a node's own filesystem:
// the static OCI hook runc runs from the host, and containerd's NRI snippet. The chart's init
// containers install them (`nvdomain node install`), and the node agent removes them when the
// release is uninstalled. Every write is atomic (a temporary file renamed into place), and a
// file nvdomain did not write is never overwritten or removed.
package hostfiles

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// Marker is the first line of every configuration file nvdomain writes on a host; a file
// without it belongs to someone else.
const Marker = "# Managed by nvdomain (the chart's enable-nri step); edits are overwritten, uninstall removes it."

// HookName is the OCI hook's file name in the hook directory.
const HookName = "nvdomain-nri-hook"

// SnippetName is the NRI snippet's file name in containerd's drop-in directory.
const SnippetName = "nri.toml"

// InstallHook copies the hook binary src to dir/nvdomain-nri-hook, replacing it atomically:
// runc may be executing the old one at that moment.
func InstallHook(src, dir string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return fmt.Errorf("read hook binary: %w", err)
	}
	return writeAtomic(filepath.Join(dir, HookName), data, 0o755)
}

// SnippetResult says what InstallSnippet did.
type SnippetResult struct {
	Path string
	// Changed: the file was written (absent or different); containerd reads it only when it
	// restarts.
	Changed bool
	// Foreign: a file without Marker is there; it was left alone.
	Foreign bool
	// Imported reports whether containerd's main config imports the drop-in directory;
	// ImportHint is the line to add when it does not, ConfigChecked whether the config could
	// be read at all.
	Imported      bool
	ConfigChecked bool
	ImportHint    string
	// ConfigMissing: containerdConfig does not exist, so containerd reads another config (a
	// distribution's own path) or none.
	ConfigMissing bool
}

// InstallSnippet writes the NRI snippet src (with Marker first) into confDir, unless a file
// nvdomain did not write is there, and checks whether containerdConfig (empty: not checked)
// imports it. hostConfDir is confDir as containerd names it on the host (the init container
// sees it mounted elsewhere). An outdated snippet of an earlier release is replaced: the
// snippet is part of the release, so an upgrade that changes it must reach the node.
func InstallSnippet(src, confDir, hostConfDir, containerdConfig string) (SnippetResult, error) {
	body, err := os.ReadFile(src)
	if err != nil {
		return SnippetResult{}, fmt.Errorf("read NRI snippet: %w", err)
	}
	want := append([]byte(Marker+"\n"), body...)
	res := SnippetResult{Path: filepath.Join(confDir, SnippetName)}
	have, err := os.ReadFile(res.Path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		res.Changed = true
	case err != nil:
		return res, fmt.Errorf("read %s: %w", res.Path, err)
	case !managed(have):
		res.Foreign = true
	case !bytes.Equal(have, want):
		res.Changed = true
	}
	if res.Changed {
		if err := writeAtomic(res.Path, want, 0o644); err != nil {
			return res, err
		}
	}
	if containerdConfig != "" {
		cfg, err := os.ReadFile(containerdConfig)
		switch {
		case err == nil:
			res.ConfigChecked = true
			res.Imported = Imports(cfg, hostConfDir)
		case errors.Is(err, fs.ErrNotExist):
			res.ConfigMissing = true
		}
		res.ImportHint = fmt.Sprintf("imports = [%q]", filepath.Join(hostConfDir, "*.toml"))
	}
	return res, nil
}

var importsLine = regexp.MustCompile(`(?m)^\s*imports\s*=\s*\[([^\]]*)\]`)

// Imports reports whether a containerd config's top-level `imports` names the NRI snippet in
// confDir (the snippet itself, or a glob that matches it). containerd reads only the imports
// its config lists; a drop-in directory nothing imports is ignored silently.
func Imports(config []byte, confDir string) bool {
	m := importsLine.FindSubmatch(config)
	if m == nil {
		return false
	}
	snippet := filepath.Join(confDir, SnippetName)
	for _, item := range strings.Split(string(m[1]), ",") {
		item = strings.Trim(strings.TrimSpace(item), `"'`)
		if item == "" {
			continue
		}
		if ok, _ := filepath.Match(item, snippet); ok {
			return true
		}
	}
	return false
}

// Remove deletes what InstallHook and InstallSnippet wrote in hookDir and confDir; a snippet
// without Marker is kept. Absent files are not an error. It returns the paths removed.
func Remove(hookDir, confDir string) ([]string, error) {
	var removed []string
	var errs []error
	if hookDir != "" {
		p := filepath.Join(hookDir, HookName)
		switch err := os.Remove(p); {
		case err == nil:
			removed = append(removed, p)
		case !errors.Is(err, fs.ErrNotExist):
			errs = append(errs, fmt.Errorf("remove %s: %w", p, err))
		}
	}
	if confDir != "" {
		p := filepath.Join(confDir, SnippetName)
		data, err := os.ReadFile(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			errs = append(errs, fmt.Errorf("read %s: %w", p, err))
		case managed(data):
			if err := os.Remove(p); err != nil {
				errs = append(errs, fmt.Errorf("remove %s: %w", p, err))
			} else {
				removed = append(removed, p)
			}
		}
	}
	return removed, errors.Join(errs...)
}

// managed reports whether nvdomain wrote data: it starts with Marker, or it is, byte for
// byte, a snippet an earlier release copied without one (the sha256 of each), so an upgrade
// still replaces it and an uninstall still removes it.
func managed(data []byte) bool {
	line, _, _ := bufio.NewReader(bytes.NewReader(data)).ReadLine()
	if string(line) == Marker {
		return true
	}
	sum := sha256.Sum256(data)
	switch hex.EncodeToString(sum[:]) {
	case "6fe681b82a9733081e14836b7a0beac7e34f7edc651346d16f6f0e8d3c73164d",
		"818672dbbddc2fbc122cd0240aa70bb0671f5b41d172f438af68f8f295d197c1",
		"8983799501c9720f22574f5d167ad210755fd349f9e595cc21fe5befb0eff6eb":
		return true
	}
	return false
}

func writeAtomic(path string, data []byte, mode fs.FileMode) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".new-")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return fmt.Errorf("chmod %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("rename into %s: %w", path, err)
	}
	return nil
}

// Package ocitest builds OCI image archives from local files for the tests that run real
// containerd: there is no registry and no Docker here, so images are written by hand (an
// uncompressed layer, a config, a manifest and an index naming the image) and imported with
// `ctr images import`.
package ocitest

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"time"
)

// File is one file of the image's root filesystem.
type File struct {
	// Source is a host file to copy; empty with Link set makes a symlink.
	Source string
	Link   string
	Mode   int64
}

// Image describes a single-layer image.
type Image struct {
	Ref        string // e.g. docker.io/library/busybox:nvdomain
	Files      map[string]File
	Entrypoint []string
	Cmd        []string
	Env        []string
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// WriteArchive writes the image as an OCI layout tar to path.
func WriteArchive(img Image, path string) error {
	layer, err := layerTar(img.Files)
	if err != nil {
		return err
	}
	layerDesc := descriptor{MediaType: "application/vnd.oci.image.layer.v1.tar", Digest: digest(layer), Size: int64(len(layer))}
	cfg, _ := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux",
		"config": map[string]any{"Entrypoint": img.Entrypoint, "Cmd": img.Cmd, "Env": img.Env},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layerDesc.Digest}},
	})
	cfgDesc := descriptor{MediaType: "application/vnd.oci.image.config.v1+json", Digest: digest(cfg), Size: int64(len(cfg))}
	manifest, _ := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": cfgDesc, "layers": []descriptor{layerDesc},
	})
	mDesc := descriptor{MediaType: "application/vnd.oci.image.manifest.v1+json", Digest: digest(manifest), Size: int64(len(manifest)),
		Annotations: map[string]string{"io.containerd.image.name": img.Ref}}
	index, _ := json.Marshal(map[string]any{"schemaVersion": 2, "manifests": []descriptor{mDesc}})

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(name string, data []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: time.Unix(0, 0), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	for _, e := range []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{"blobs/sha256/" + layerDesc.Digest[7:], layer},
		{"blobs/sha256/" + cfgDesc.Digest[7:], cfg},
		{"blobs/sha256/" + mDesc.Digest[7:], manifest},
	} {
		if err := add(e.name, e.data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}

func layerTar(files map[string]File) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	dirs := map[string]bool{}
	for _, p := range paths {
		for d := dirOf(p); d != ""; d = dirOf(d) {
			if !dirs[d] {
				dirs[d] = true
			}
		}
	}
	dlist := make([]string, 0, len(dirs))
	for d := range dirs {
		dlist = append(dlist, d)
	}
	sort.Strings(dlist)
	for _, d := range dlist {
		if err := tw.WriteHeader(&tar.Header{Name: d + "/", Mode: 0o755, Typeflag: tar.TypeDir, ModTime: time.Unix(0, 0)}); err != nil {
			return nil, err
		}
	}
	for _, p := range paths {
		f := files[p]
		if f.Link != "" {
			if err := tw.WriteHeader(&tar.Header{Name: p, Linkname: f.Link, Typeflag: tar.TypeSymlink, Mode: 0o777, ModTime: time.Unix(0, 0)}); err != nil {
				return nil, err
			}
			continue
		}
		data, err := os.ReadFile(f.Source)
		if err != nil {
			return nil, fmt.Errorf("image file %s: %w", p, err)
		}
		mode := f.Mode
		if mode == 0 {
			mode = 0o755
		}
		if err := tw.WriteHeader(&tar.Header{Name: p, Mode: mode, Size: int64(len(data)), Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func dirOf(p string) string {
	for i := len(p) - 1; i >= 0; i-- {
		if p[i] == '/' {
			return p[:i]
		}
	}
	return ""
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

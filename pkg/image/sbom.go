package image

import (
	"context"
	"debug/buildinfo"
	"encoding/json"
	"fmt"
	"os/exec"
	"sort"
	"strings"
)

// sbomBuilder collects what the image holds: the Go modules linked into each binary (read
// back from the binary's build information, so it lists what was linked, not what go.mod
// wishes) and the Debian packages the copied shared libraries come from.
type sbomBuilder struct {
	goModules map[string]string // path@version → sum
	binaries  []string
	debs      map[string]string // package → version
	files     map[string]string // image path → package
}

func (s *sbomBuilder) addBinary(name, path string) error {
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		return fmt.Errorf("image: build information of %s: %w", path, err)
	}
	if s.goModules == nil {
		s.goModules = map[string]string{}
	}
	s.binaries = append(s.binaries, name+" ("+info.GoVersion+")")
	s.goModules["stdlib@"+info.GoVersion] = ""
	for _, m := range info.Deps {
		if m.Replace != nil {
			m = m.Replace
		}
		s.goModules[m.Path+"@"+m.Version] = m.Sum
	}
	return nil
}

// addHostFile records a file copied from this machine (path) to inImage, with the Debian
// package that holds it; without dpkg (a non-Debian build machine) the package is
// NOASSERTION.
func (s *sbomBuilder) addHostFile(ctx context.Context, path, inImage string) {
	if s.debs == nil {
		s.debs, s.files = map[string]string{}, map[string]string{}
	}
	pkg := "NOASSERTION"
	if out, err := exec.CommandContext(ctx, "dpkg", "-S", path).Output(); err == nil {
		if i := strings.Index(string(out), ":"); i > 0 {
			pkg = strings.TrimSpace(string(out)[:i])
		}
	}
	if pkg != "NOASSERTION" {
		if _, ok := s.debs[pkg]; !ok {
			v := "NOASSERTION"
			if out, err := exec.CommandContext(ctx, "dpkg-query", "-W", "-f=${Version}", pkg).Output(); err == nil {
				v = strings.TrimSpace(string(out))
			}
			s.debs[pkg] = v
		}
	}
	s.files[strings.TrimPrefix(inImage, "/")] = pkg
}

type spdxPackage struct {
	SPDXID           string         `json:"SPDXID"`
	Name             string         `json:"name"`
	VersionInfo      string         `json:"versionInfo"`
	DownloadLocation string         `json:"downloadLocation"`
	FilesAnalyzed    bool           `json:"filesAnalyzed"`
	Checksums        []spdxChecksum `json:"checksums,omitempty"`
	ExternalRefs     []spdxRef      `json:"externalRefs,omitempty"`
	Comment          string         `json:"comment,omitempty"`
}

type spdxChecksum struct {
	Algorithm string `json:"algorithm"`
	Value     string `json:"checksumValue"`
}

type spdxRef struct {
	Category string `json:"referenceCategory"`
	Type     string `json:"referenceType"`
	Locator  string `json:"referenceLocator"`
}

type spdxRelationship struct {
	Element string `json:"spdxElementId"`
	Type    string `json:"relationshipType"`
	Related string `json:"relatedSpdxElement"`
}

// document writes an SPDX 2.3 JSON document: the image as the described package, one
// package per Go module and Debian package, each CONTAINED_BY the image.
func (s *sbomBuilder) document(o Options) ([]byte, error) {
	root := spdxPackage{
		SPDXID: "SPDXRef-Package-nvdomain", Name: "nvdomain", VersionInfo: o.Version,
		DownloadLocation: "NOASSERTION",
		Comment:          "binaries: " + strings.Join(s.binaries, ", ") + "; revision " + o.Revision,
	}
	pkgs := []spdxPackage{root}
	rels := []spdxRelationship{{Element: "SPDXRef-DOCUMENT", Type: "DESCRIBES", Related: root.SPDXID}}
	modules := make([]string, 0, len(s.goModules))
	for m := range s.goModules {
		modules = append(modules, m)
	}
	sort.Strings(modules)
	for i, m := range modules {
		path, ver, _ := strings.Cut(m, "@")
		p := spdxPackage{
			SPDXID: fmt.Sprintf("SPDXRef-Go-%d", i), Name: path, VersionInfo: ver, DownloadLocation: "NOASSERTION",
			ExternalRefs: []spdxRef{{Category: "PACKAGE-MANAGER", Type: "purl", Locator: "pkg:golang/" + path + "@" + ver}},
		}
		if sum := s.goModules[m]; sum != "" {
			p.Comment = "go.sum " + sum
		}
		pkgs = append(pkgs, p)
		rels = append(rels, spdxRelationship{Element: p.SPDXID, Type: "CONTAINED_BY", Related: root.SPDXID})
	}
	debs := make([]string, 0, len(s.debs))
	for d := range s.debs {
		debs = append(debs, d)
	}
	sort.Strings(debs)
	for i, d := range debs {
		var files []string
		for f, p := range s.files {
			if p == d {
				files = append(files, "/"+f)
			}
		}
		sort.Strings(files)
		name, arch, _ := strings.Cut(d, ":")
		purl := "pkg:deb/debian/" + name + "@" + s.debs[d]
		if arch != "" {
			purl += "?arch=" + arch
		}
		p := spdxPackage{
			SPDXID: fmt.Sprintf("SPDXRef-Deb-%d", i), Name: name, VersionInfo: s.debs[d], DownloadLocation: "NOASSERTION",
			ExternalRefs: []spdxRef{{Category: "PACKAGE-MANAGER", Type: "purl", Locator: purl}},
			Comment:      "files: " + strings.Join(files, ", "),
		}
		pkgs = append(pkgs, p)
		rels = append(rels, spdxRelationship{Element: p.SPDXID, Type: "CONTAINED_BY", Related: root.SPDXID})
	}
	doc := map[string]any{
		"spdxVersion":       "SPDX-2.3",
		"dataLicense":       "CC0-1.0",
		"SPDXID":            "SPDXRef-DOCUMENT",
		"name":              "nvdomain-" + o.Version,
		"documentNamespace": "https://github.com/nvdomain/nvdomain/spdx/" + o.Version + "-" + o.Revision,
		"creationInfo": map[string]any{
			"created":  o.Created.UTC().Format("2006-01-02T15:04:05Z"),
			"creators": []string{"Tool: nvdomain-image"},
		},
		"packages":      pkgs,
		"relationships": rels,
	}
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("image: SBOM: %w", err)
	}
	return append(out, '\n'), nil
}

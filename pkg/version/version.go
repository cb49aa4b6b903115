// Package version holds the build's version string, set at link time, so every binary of
// the release image reports the same one (logs at start, the CLI's `version`, the image's
// labels). Operators read it to check the version skew rules of docs/operations.md.
package version

// Version is set with -ldflags "-X github.com/nvdomain/nvdomain/pkg/version.Version=…" by
// `make build` and `make image`; a plain `go build` reports "dev".
//
// It is a variable only because the linker can set nothing else; nothing assigns it at run
// time.
var Version = "dev"

// LinkerFlag is the -X flag that sets Version to v.
func LinkerFlag(v string) string {
	return "-X github.com/nvdomain/nvdomain/pkg/version.Version=" + v
}

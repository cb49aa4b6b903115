// Command nvdomain-image builds nvdomain's release image without a Docker engine: `make
// image` runs it to write an OCI image layout and an importable archive, and
// manifests/image/Dockerfile runs it with --rootfs to lay out the same root filesystem. See
// package image.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr/funcr"

	"github.com/nvdomain/nvdomain/pkg/image"
)

func main() {
	var (
		o       image.Options
		ref     string
		out     string
		rootfs  string
		created int64
	)
	flag.StringVar(&o.ModuleDir, "module-dir", ".", "the repository's root")
	flag.StringVar(&o.Version, "version", "", "version linked into the binaries and recorded as a label (required)")
	flag.StringVar(&o.Revision, "revision", "unknown", "commit recorded as a label")
	flag.Int64Var(&created, "created", sourceDateEpoch(), "creation time in Unix seconds (default $SOURCE_DATE_EPOCH, else 0), the time of every file")
	flag.StringVar(&ref, "ref", "", "image reference repository:tag (default "+image.DefaultRepository+":<version>)")
	flag.StringVar(&out, "out", "bin/image", "directory for the OCI layout <tag>/ and the archive nvdomain-<tag>.tar")
	flag.StringVar(&rootfs, "rootfs", "", "only lay out the root filesystem in this directory (the Dockerfile's build step)")
	platforms := flag.String("platforms", "", "comma-separated platforms of the image index, linux/amd64 and linux/arm64 (default: this machine's); with --rootfs, the one platform to lay out (the Dockerfile passes $TARGETPLATFORM)")
	verbose := flag.Bool("v", false, "log each build step")
	flag.Parse()
	o.Created = time.Unix(created, 0).UTC()
	o.Log = funcr.New(func(_, args string) { fmt.Fprintln(os.Stderr, args) }, funcr.Options{Verbosity: map[bool]int{true: 1}[*verbose]})
	for _, p := range strings.Split(*platforms, ",") {
		if p = strings.TrimSpace(p); p != "" {
			arch, ok := strings.CutPrefix(p, "linux/")
			if !ok {
				fail(fmt.Errorf("--platforms %q: only linux/<arch> platforms are built (linux/amd64, linux/arm64)", p))
			}
			o.Platforms = append(o.Platforms, arch)
		}
	}
	if ref == "" {
		ref = image.DefaultRepository + ":" + o.Version
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if rootfs != "" {
		if len(o.Platforms) > 1 {
			fail(fmt.Errorf("--rootfs lays out one platform; --platforms names %d", len(o.Platforms)))
		}
		if len(o.Platforms) == 1 {
			o.Arch = o.Platforms[0]
		}
		if err := image.RootFS(ctx, o, rootfs); err != nil {
			fail(err)
		}
		return
	}
	res, err := image.Build(ctx, o, ref, out)
	if err != nil {
		fail(err)
	}
	fmt.Printf("image   %s\nindex   %s\n", res.Ref, res.Digest)
	for _, arch := range o.Platforms {
		fmt.Printf("  linux/%-6s %s\n", arch, res.Images[arch])
	}
	fmt.Printf("layout  %s\narchive %s\n", res.Layout, res.Archive)
}

func sourceDateEpoch() int64 {
	v, err := strconv.ParseInt(os.Getenv("SOURCE_DATE_EPOCH"), 10, 64)
	if err != nil {
		return 0
	}
	return v
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "nvdomain-image: %v\n", err)
	os.Exit(1)
}

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
	verbose := flag.Bool("v", false, "log each build step")
	flag.Parse()
	o.Created = time.Unix(created, 0).UTC()
	o.Log = funcr.New(func(_, args string) { fmt.Fprintln(os.Stderr, args) }, funcr.Options{Verbosity: map[bool]int{true: 1}[*verbose]})
	if ref == "" {
		ref = image.DefaultRepository + ":" + o.Version
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if rootfs != "" {
		if err := image.RootFS(ctx, o, rootfs); err != nil {
			fail(err)
		}
		return
	}
	res, err := image.Build(ctx, o, ref, out)
	if err != nil {
		fail(err)
	}
	fmt.Printf("image   %s\ndigest  %s\nlayout  %s\narchive %s\n", res.Ref, res.Digest, res.Layout, res.Archive)
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

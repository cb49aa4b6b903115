// Command demo is `make demo`: a real single-node cluster on this machine, nvdomain installed
// with its Helm chart in simulated mode, the seed scenarios applied with kubectl from
// manifests/examples, `nvdomain status` and `nvdomain explain` on the result, the day-2 and
// node-side scenarios, and a readable report. The terminal gets one line per phase with its
// time, then the report; everything else (the scenarios' commentary, build output) goes to a
// log file named at the end. KEEP=1 leaves the cluster up; `make down` (demo -down) stops it.
// MODE=dra installs nvdomain as the node's DRA driver and runs the DRA-mode scenarios
// (docs/dra.md).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/nvdomain/nvdomain/test/localcluster"
)

func main() {
	down := flag.Bool("down", false, "stop the cluster that `KEEP=1 make demo` left running, and clean up after it")
	flag.Parse()
	if *down {
		dir, err := localcluster.Down(os.Stdout)
		switch {
		case errors.Is(err, localcluster.ErrNothingKept):
			fmt.Println(err)
		case err != nil:
			fmt.Fprintf(os.Stderr, "down: %v\n", err)
			os.Exit(1)
		default:
			fmt.Printf("stopped the cluster kept in %s: no process, mount, cgroup or kernel setting of it is left\n", dir)
		}
		return
	}
	os.Exit(run())
}

// logFile opens the log the Makefile started (NVDOMAIN_DEMO_LOG, which holds the build
// output) or a new one.
func logFile() (*os.File, error) {
	if path := os.Getenv("NVDOMAIN_DEMO_LOG"); path != "" {
		f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
		if err != nil {
			return nil, fmt.Errorf("open the demo log: %w", err)
		}
		return f, nil
	}
	f, err := os.CreateTemp("/tmp", "nvdomain-demo-*.log")
	if err != nil {
		return nil, fmt.Errorf("create the demo log: %w", err)
	}
	return f, nil
}

// phase prints its name, runs fn with the log as its writer, and prints the time it took.
func phase(log io.Writer, name string, fn func() error) error {
	fmt.Printf("%-22s … ", name)
	fmt.Fprintf(log, "\n######## %s\n", name)
	start := time.Now()
	err := fn()
	took := time.Since(start).Round(time.Second)
	if err != nil {
		fmt.Printf("failed after %s\n", took)
		fmt.Fprintf(log, "\n%s failed: %v\n", name, err)
		return fmt.Errorf("%s: %w", name, err)
	}
	fmt.Printf("%s\n", took)
	return nil
}

func run() int {
	// A closed terminal or a reader that went away (make demo | head) must not kill the demo
	// before its teardown: SIGHUP cancels like ^C, and a write to a broken pipe fails instead
	// of raising SIGPIPE.
	signal.Ignore(syscall.SIGPIPE)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	log, err := logFile()
	if err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		return 1
	}
	defer log.Close()
	keep := os.Getenv("KEEP") == "1"
	err = demo(ctx, log, keep)
	if err != nil {
		// The error can carry a kubectl describe; the terminal gets its start, the log all of it.
		msg := err.Error()
		if lines := strings.Split(msg, "\n"); len(lines) > 12 {
			msg = strings.Join(lines[:12], "\n") + "\n…"
		}
		fmt.Fprintf(os.Stderr, "demo: %s\n", msg)
	}
	fmt.Printf("\nlog: %s\n", log.Name())
	if err != nil {
		return 1
	}
	return 0
}

func demo(ctx context.Context, log io.Writer, keep bool) (err error) {
	mode := os.Getenv("MODE")
	if mode != "" && mode != "classic" && mode != localcluster.ModeDRA {
		return fmt.Errorf("MODE=%s: use classic (the default) or dra", mode)
	}
	var c *localcluster.Cluster
	if err := phase(log, "cluster up", func() error {
		c, err = localcluster.Start(ctx, localcluster.Options{Log: log, Keep: keep, Mode: mode})
		return err
	}); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			// The components' logs go with the work directory; keep their ends.
			for _, name := range []string{"kubelet", "containerd", "kube-apiserver", "kube-scheduler"} {
				fmt.Fprintf(log, "\n######## the end of %s's log\n%s\n", name, c.Log(name, 4000))
			}
		}
		if keep {
			c.Stop()
			fmt.Printf("\nKEEP=1: the cluster stays up: export KUBECONFIG=%s\n         `make down` stops it and cleans up (processes, mounts, cgroups, kernel settings)\n", c.Kubeconfig)
			return
		}
		_ = phase(log, "cluster stopped", func() error { c.Stop(); return nil })
	}()
	if err := phase(log, "nvdomain installed", func() error { return c.Install(ctx, log) }); err != nil {
		return err
	}
	if c.Mode() == localcluster.ModeDRA {
		var dr *localcluster.DRAReport
		if err := phase(log, "DRA-mode scenarios", func() (err error) { dr, err = c.RunDRAScenarios(ctx, log); return err }); err != nil {
			return err
		}
		for _, w := range []io.Writer{os.Stdout, log} {
			dr.Write(w)
		}
		return nil
	}
	var rep *localcluster.Report
	if err := phase(log, "seed scenarios", func() (err error) { rep, err = c.RunScenarios(ctx, log); return err }); err != nil {
		return err
	}
	var cliRep *localcluster.CLIReport
	if err := phase(log, "status and explain", func() (err error) { cliRep, err = c.RunCLI(ctx, log, rep); return err }); err != nil {
		return err
	}
	var d2 *localcluster.Day2Report
	if err := phase(log, "day-2 scenarios", func() (err error) { d2, err = c.RunDay2(ctx, log, rep); return err }); err != nil {
		return err
	}
	var ns *localcluster.NodeSideReport
	if err := phase(log, "node-side scenarios", func() (err error) { ns, err = c.RunNodeSide(ctx, log, rep); return err }); err != nil {
		return err
	}
	for _, w := range []io.Writer{os.Stdout, log} {
		rep.Write(w)
		cliRep.Write(w)
		d2.Write(w)
		ns.Write(w)
	}
	return nil
}

// Package netns runs a test binary inside a private network namespace of its own. Tests
// that need several servers behind one Kubernetes Service (webhook replicas whose endpoints
// come and go) need addresses outside 127.0.0.0/8, because EndpointSlices refuse loopback
// addresses; in a namespace the test made itself, extra addresses on its own loopback
// device are those addresses, and no packet can leave the namespace.
package netns

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

const insideEnv = "NVDOMAIN_TEST_NETNS"

// Enter re-executes the running test binary in a new network namespace (`unshare --net`)
// and returns its exit code with reexecuted true; the caller exits with that code. Inside the
// namespace, or where it cannot make one (not root, no unshare), it returns reexecuted false
// and the tests run here; Inside then says which.
func Enter() (code int, reexecuted bool) {
	if Inside() {
		if err := run("ip", "link", "set", "lo", "up"); err != nil {
			fmt.Fprintf(os.Stderr, "netns: %v\n", err)
			return 1, true
		}
		return 0, false
	}
	if os.Geteuid() != 0 {
		return 0, false
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		return 0, false
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return 0, false
	}
	self, err := os.Executable()
	if err != nil {
		return 0, false
	}
	cmd := exec.Command(unshare, append([]string{"--net", "--", self}, os.Args[1:]...)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), insideEnv+"=1")
	if err := cmd.Run(); err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return exit.ExitCode(), true
		}
		fmt.Fprintf(os.Stderr, "netns: %v\n", err)
		return 1, true
	}
	return 0, true
}

// Inside reports whether this process runs in a namespace Enter made.
func Inside() bool { return os.Getenv(insideEnv) == "1" }

// Why says why a test that needs the namespace cannot run, or "" when it can.
func Why() string {
	switch {
	case Inside():
		return ""
	case os.Geteuid() != 0:
		return "needs root to make a private network namespace (CI runs as root)"
	default:
		return "needs unshare (util-linux) and ip (iproute2) to make a private network namespace"
	}
}

// AddAddress gives the namespace's loopback device one more address, e.g. 192.0.2.11 (from
// TEST-NET-1, documentation only, so it can mean nothing outside).
func AddAddress(ip string) error {
	if !Inside() {
		return errors.New("netns: not inside a private network namespace")
	}
	out, err := exec.Command("ip", "addr", "add", ip+"/32", "dev", "lo").CombinedOutput()
	if err != nil && !strings.Contains(string(out), "File exists") && !strings.Contains(string(out), "already assigned") {
		return fmt.Errorf("netns: ip addr add %s: %v: %s", ip, err, out)
	}
	return nil
}

func run(name string, args ...string) error {
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

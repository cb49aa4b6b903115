package localcluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/crypto/bcrypt"
)

// Registry is a CNCF Distribution registry (built by test/tools/build-registry.sh) listening on
// loopback that serves nothing without credentials: a private registry as a GPU cluster's
// release images live in. The kubelet pulls from it by imagePullSecrets; containerd reaches it
// over plain HTTP (TrustRegistry).
type Registry struct {
	// Host is host:port, the first part of the references it serves.
	Host string
	// User and Password are the only credentials it accepts.
	User, Password string
	dir            string
	cmd            *exec.Cmd
	exited         chan struct{}
}

// StartRegistry starts a registry with one htpasswd user and a random password, in a
// temporary directory that Stop removes.
func StartRegistry(ctx context.Context) (r *Registry, err error) {
	out, err := (&Cluster{Root: repoRoot()}).tool("build-registry.sh")
	if err != nil {
		return nil, err
	}
	pw := make([]byte, 12)
	if _, err := rand.Read(pw); err != nil {
		return nil, err
	}
	r = &Registry{User: "nvdomain-pull", Password: hex.EncodeToString(pw)}
	if r.dir, err = os.MkdirTemp("/tmp", "nvdreg"); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			r.Stop()
		}
	}()
	hash, err := bcrypt.GenerateFromPassword([]byte(r.Password), bcrypt.DefaultCost)
	if err != nil {
		return r, err
	}
	if err := os.WriteFile(filepath.Join(r.dir, "htpasswd"), []byte(r.User+":"+string(hash)+"\n"), 0o600); err != nil {
		return r, err
	}
	// freePort's port may be taken before the registry binds it: a registry that exits while
	// starting is tried again on another port.
	for try := 1; ; try++ {
		if err = r.serve(ctx, out); err == nil || try == 3 {
			return r, err
		}
	}
}

// serve starts the registry on a free port and waits until it answers.
func (r *Registry) serve(ctx context.Context, bin string) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	r.Host = fmt.Sprintf("127.0.0.1:%d", port)
	cfg := fmt.Sprintf(`version: 0.1
log:
  level: info
storage:
  filesystem:
    rootdirectory: %[1]s/storage
http:
  addr: %[2]s
auth:
  htpasswd:
    realm: nvdomain-e2e
    path: %[1]s/htpasswd
`, r.dir, r.Host)
	if err := os.WriteFile(filepath.Join(r.dir, "config.yml"), []byte(cfg), 0o644); err != nil {
		return err
	}
	logf, err := os.Create(filepath.Join(r.dir, "registry.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	r.cmd = exec.Command(filepath.Join(bin, "registry"), "serve", filepath.Join(r.dir, "config.yml"))
	r.cmd.Stdout, r.cmd.Stderr = logf, logf
	// The registry's OpenTelemetry exporter would otherwise dial an OTLP collector.
	r.cmd.Env = append(os.Environ(), "OTEL_SDK_DISABLED=true", "OTEL_TRACES_EXPORTER=none", "OTEL_METRICS_EXPORTER=none", "OTEL_LOGS_EXPORTER=none")
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := r.cmd.Start(); err != nil {
		return fmt.Errorf("start the registry: %w", err)
	}
	exited := make(chan struct{})
	r.exited = exited
	go func() { _ = r.cmd.Wait(); close(exited) }()
	// Up when /v2/ answers with 401 (credentials required); down for good when it exits.
	gone := false
	err = waitUntil(ctx, 30*time.Second, "the registry to answer on "+r.Host, func() bool {
		select {
		case <-exited:
			gone = true
			return true
		default:
		}
		resp, err := http.Get("http://" + r.Host + "/v2/")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusUnauthorized
	})
	if gone {
		r.cmd = nil
		return fmt.Errorf("the registry exited while starting on %s; log: %s", r.Host, r.Log())
	}
	if err != nil {
		_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
		<-exited
		r.cmd = nil
		return fmt.Errorf("%w; log: %s", err, r.Log())
	}
	return nil
}

// Stop kills the registry and removes its storage.
func (r *Registry) Stop() {
	if r.cmd != nil && r.cmd.Process != nil {
		_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
		<-r.exited
	}
	if r.dir != "" {
		_ = os.RemoveAll(r.dir)
	}
}

// Log is the registry's log.
func (r *Registry) Log() string {
	b, _ := os.ReadFile(filepath.Join(r.dir, "registry.log"))
	return string(b)
}

// Auth is the registry's credentials for go-containerregistry.
func (r *Registry) Auth() authn.Authenticator {
	return &authn.Basic{Username: r.User, Password: r.Password}
}

// Push pushes the single image of a `docker save`-style archive (image.Result.Archive) as
// <Host>/<repository>:<tag> and returns that reference.
func (r *Registry) Push(ctx context.Context, archive, repository, tag string) (string, error) {
	img, err := tarball.ImageFromPath(archive, nil)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", archive, err)
	}
	ref := r.Host + "/" + repository + ":" + tag
	parsed, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		return "", err
	}
	if err := remote.Write(parsed, img, remote.WithAuth(r.Auth()), remote.WithContext(ctx)); err != nil {
		return "", fmt.Errorf("push %s: %w", ref, err)
	}
	return ref, nil
}

// Readable says whether ref's manifest can be read with auth (nil: anonymously), and the
// registry's answer when it cannot.
func (r *Registry) Readable(ctx context.Context, ref string, auth authn.Authenticator) error {
	parsed, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		return err
	}
	if auth == nil {
		auth = authn.Anonymous
	}
	_, err = remote.Head(parsed, remote.WithAuth(auth), remote.WithContext(ctx))
	return err
}

// TrustRegistry lets the node's containerd pull from host over plain HTTP: a hosts.toml in
// the registry configuration directory its config names (config_path), which containerd
// reads at every pull.
func (c *Cluster) TrustRegistry(host string) error {
	if strings.ContainsAny(host, "/ ") || host == "" {
		return errors.New("TrustRegistry: host must be host:port")
	}
	dir := filepath.Join(c.registryConfigDir(), host)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	toml := fmt.Sprintf("server = \"http://%[1]s\"\n\n[host.\"http://%[1]s\"]\n  capabilities = [\"pull\", \"resolve\"]\n", host)
	return os.WriteFile(filepath.Join(dir, "hosts.toml"), []byte(toml), 0o644)
}

// registryConfigDir is containerd's registry configuration directory (certs.d).
func (c *Cluster) registryConfigDir() string { return c.path("certs.d") }

// HasImage says whether the node's containerd holds ref.
func (c *Cluster) HasImage(ref string) bool {
	out, err := exec.Command(filepath.Join(c.CtrdBin, "ctr"), "--address", c.path("c.sock"), "-n", "k8s.io", "images", "ls", "-q").Output()
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(out), "\n") {
		if strings.TrimSpace(l) == ref {
			return true
		}
	}
	return false
}

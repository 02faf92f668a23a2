// Package azuritetest runs Azurite, Microsoft's Azure Blob emulator, on a
// free loopback port for tests, and for integration tests that point a
// separate spotagent process at it through the environment (Server.Env).
//
// Azurite is a Node.js program from the npm registry; scripts/test-deps.sh
// installs the pinned Version into the cache (Dir). A test that needs it
// fails, never skips, when it is missing: the message says how to install
// it.
package azuritetest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"
)

// Version is the Azurite release scripts/test-deps.sh installs: the newest
// that runs on Node 20 (3.36 needs Node 21, 3.37 Node 22).
const Version = "3.35.0"

// The emulator's well-known development account (public, documented by
// Microsoft); Azurite serves it by default.
const (
	Account   = "devstoreaccount1"
	Key       = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
	Container = "spotagent-test"
)

// startTimeout bounds Azurite's start (Node loads ~370 packages: seconds
// on a loaded 2-core machine).
const startTimeout = 90 * time.Second

// Dir is where scripts/test-deps.sh installs Azurite:
// ${XDG_CACHE_HOME:-~/.cache}/spotagent-azurite/<Version>.
func Dir() string {
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache")
	}
	return filepath.Join(cache, "spotagent-azurite", Version)
}

// Binary is the azurite-blob command: $SPOTAGENT_AZURITE when set, else
// the one in Dir.
func Binary() (string, error) {
	if b := os.Getenv("SPOTAGENT_AZURITE"); b != "" {
		return b, nil
	}
	b := filepath.Join(Dir(), "node_modules", ".bin", "azurite-blob")
	if _, err := os.Stat(b); err != nil {
		return "", fmt.Errorf("azurite %s is not installed (%w): run scripts/test-deps.sh, or set SPOTAGENT_AZURITE to an azurite-blob", Version, err)
	}
	return b, nil
}

// Server is a running Azurite blob service.
type Server struct {
	URL      string // http://127.0.0.1:port
	Endpoint string // the account's blob service URL: URL/devstoreaccount1
	cmd      *exec.Cmd
	done     chan struct{}
}

var listenRE = regexp.MustCompile(`listens on (http://127\.0\.0\.1:\d+)`)

// Start runs Azurite in memory on a free loopback port, with Container
// created. The caller closes it.
func Start(ctx context.Context, dir string) (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "--blobHost", "127.0.0.1", "--blobPort", "0",
		"--inMemoryPersistence", "--skipApiVersionCheck", "--disableTelemetry", "--loose", "--silent")
	cmd.Dir = dir // in memory, but anything it writes goes there
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start azurite: %w", err)
	}
	s := &Server{cmd: cmd, done: make(chan struct{})}
	found := make(chan string, 1)
	var log strings.Builder
	go func() {
		defer close(s.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if m := listenRE.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case found <- m[1]:
				default:
				}
			} else if log.Len() < 4096 {
				log.WriteString(sc.Text() + "\n")
			}
		}
		_, _ = io.Copy(io.Discard, out)
		_ = cmd.Wait()
	}()
	select {
	case s.URL = <-found:
	case <-s.done:
		return nil, fmt.Errorf("azurite exited before listening: %s", log.String())
	case <-time.After(startTimeout):
		s.Close()
		return nil, fmt.Errorf("azurite did not listen within %s", startTimeout)
	case <-ctx.Done():
		s.Close()
		return nil, ctx.Err()
	}
	s.Endpoint = s.URL + "/" + Account
	if err := s.CreateContainer(ctx, Container); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// ConnectionString is the Azure Storage connection string for the
// development account on this server.
func (s *Server) ConnectionString() string {
	return "DefaultEndpointsProtocol=http;AccountName=" + Account + ";AccountKey=" + Key + ";BlobEndpoint=" + s.Endpoint + ";"
}

// CreateContainer creates a container in the development account.
func (s *Server) CreateContainer(ctx context.Context, name string) error {
	cl, err := container.NewClientFromConnectionString(s.ConnectionString(), name, nil)
	if err != nil {
		return err
	}
	if _, err := cl.Create(ctx, nil); err != nil {
		return fmt.Errorf("create container %s: %w", name, err)
	}
	return nil
}

// Env is what a spotagent process needs to use this server with
// --store az://spotagent-test/<prefix>: a connection string (shared key),
// so that no credential chain, and no metadata endpoint, is tried.
func (s *Server) Env() []string {
	return []string{"AZURE_STORAGE_CONNECTION_STRING=" + s.ConnectionString()}
}

// Pid is Azurite's process ID (for its CPU time in benchmarks).
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// Close stops Azurite (its process group) and waits for it.
func (s *Server) Close() {
	if s.cmd.Process != nil {
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	}
	<-s.done
}

// New starts a server for the test in a temporary directory, stops it at
// the end, and fails the test when Azurite cannot start.
func New(t testing.TB) *Server {
	t.Helper()
	dir, err := os.MkdirTemp("", "azurite-")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout+30*time.Second)
	defer cancel()
	s, err := Start(ctx, dir)
	if err != nil {
		os.RemoveAll(dir)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close()
		os.RemoveAll(dir)
	})
	return s
}

// NewServer is New, with the test process's environment (t.Setenv: not
// for parallel tests) set to use it.
func NewServer(t testing.TB) *Server {
	t.Helper()
	s := New(t)
	for _, kv := range s.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	return s
}

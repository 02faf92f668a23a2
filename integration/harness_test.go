// Package integration runs the spotagent binary end to end: real trainer
// processes (Python, PyTorch), fake clouds on loopback, real stores.
package integration

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// bin is the spotagent binary built once for the whole package.
var bin string

// repo is the repository root.
var repo string

// python is the trainers' interpreter: /usr/bin/python3 (torch 1.13), or
// $SPOTAGENT_TEST_PYTHON (make test-python runs the torch tests again with
// scripts/sid-python: torch 2.x).
var python = testPython()

func TestMain(m *testing.M) {
	_, file, _, _ := runtime.Caller(0)
	repo = filepath.Dir(filepath.Dir(file))
	dir, err := os.MkdirTemp("", "spotagent-it-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// No spotagent or SDK started here asks the link-local metadata
	// address for credentials (tests that fake IMDS point at their fake).
	os.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	bin = filepath.Join(dir, "spotagent")
	// The tag of the shipped build (Makefile TAGS), with the race detector.
	build := exec.Command("go", "build", "-race", "-tags", "disable_grpc_modules", "-o", bin, "./cmd/spotagent")
	build.Dir = repo
	build.Stdout, build.Stderr = os.Stdout, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build spotagent:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a running spotagent with its output collected line by line.
type proc struct {
	t       *testing.T
	cmd     *exec.Cmd
	mu      sync.Mutex
	lines   []string
	drained bool // the output pipe reached EOF
	cond    *sync.Cond
	done    chan struct{}
	code    int
}

// start runs spotagent with args and extra environment.
func start(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), env...)
	return startCmd(t, cmd)
}

// startCmd runs cmd with its output collected line by line.
func startCmd(t *testing.T, cmd *exec.Cmd) *proc {
	t.Helper()
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	p := &proc{t: t, cmd: cmd, done: make(chan struct{})}
	p.cond = sync.NewCond(&p.mu)
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", cmd.Path, err)
	}
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			p.cond.Broadcast()
			p.mu.Unlock()
		}
		p.mu.Lock()
		p.drained = true
		p.cond.Broadcast()
		p.mu.Unlock()
	}()
	go func() {
		err := cmd.Wait()
		pw.Close()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			code = -1
		}
		p.mu.Lock()
		p.code = code
		p.cond.Broadcast()
		p.mu.Unlock()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", strings.Join(cmd.Args, " "), p.output())
		}
	})
	return p
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}

// waitLine waits for a line matching re and returns its submatches.
func (p *proc) waitLine(re string, timeout time.Duration) []string {
	p.t.Helper()
	if m, err := p.findLine(re, timeout); err != nil {
		p.t.Fatal(err)
	} else {
		return m
	}
	return nil
}

func (p *proc) findLine(re string, timeout time.Duration) ([]string, error) {
	rx := regexp.MustCompile(re)
	deadline := time.Now().Add(timeout)
	timer := time.AfterFunc(timeout, func() { p.mu.Lock(); p.cond.Broadcast(); p.mu.Unlock() })
	defer timer.Stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := 0; ; {
		for ; i < len(p.lines); i++ {
			if m := rx.FindStringSubmatch(p.lines[i]); m != nil {
				return m, nil
			}
		}
		select {
		case <-p.done:
			// The output pipe may still hold lines: wait for it to drain.
			if p.drained {
				return nil, fmt.Errorf("%s exited without printing a line matching %q", p.cmd.Path, re)
			}
		default:
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no line matching %q within %s", re, timeout)
		}
		p.cond.Wait()
	}
}

// wait waits for exit and returns the exit code.
func (p *proc) wait(timeout time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(timeout):
		p.t.Fatalf("spotagent still running after %s", timeout)
	}
	return -1
}

func (p *proc) signal(sig syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("signal: %v", err)
	}
}

// atoi parses a submatch.
func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// shortTemp is a temp dir with a short path (Unix socket paths are short).
func shortTemp(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "sa-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// requirePython fails (never skips) when the trainer's interpreter, or
// torch for the PyTorch tests, is missing: `make test` installs them.
func requirePython(t *testing.T, torch bool) {
	t.Helper()
	if _, err := os.Stat(python); err != nil {
		t.Fatalf("%s missing: run scripts/test-deps.sh", python)
	}
	if torch {
		if out, err := exec.Command(python, "-c", "import torch").CombinedOutput(); err != nil {
			t.Fatalf("python3-torch missing (run scripts/test-deps.sh): %v %s", err, out)
		}
	}
}

func readFile(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func sameFile(t *testing.T, a, b string) {
	t.Helper()
	if x, y := readFile(t, a), readFile(t, b); !bytes.Equal(x, y) {
		t.Fatalf("%s and %s differ:\n%s\n---\n%s", a, b, x, y)
	}
}

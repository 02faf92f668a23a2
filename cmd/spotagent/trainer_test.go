package main

import (
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
)

// testPython is the interpreter of these tests' Python trainers (Debian's;
// the trainers find the client in this checkout themselves).
const testPython = "/usr/bin/python3"

// exampleTrainer is the command line (after "--") of the pure-Python
// example trainer, python/examples/train.py, with its flags.
func exampleTrainer(t *testing.T, flags ...string) []string {
	t.Helper()
	return append([]string{testPython, repoFile(t, "python/examples/train.py")}, flags...)
}

// repoFile is the absolute path of a file of this repository.
func repoFile(t *testing.T, rel string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("..", "..", rel))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatal(err)
	}
	return p
}

// guardSIGTERM registers this process for SIGTERM for the test's length:
// a test that stops an in-process agent with its own SIGTERM (sigtermSelf)
// must not be killed by one that comes after the agent stopped listening.
func guardSIGTERM(t *testing.T) {
	guard := make(chan os.Signal, 1)
	signal.Notify(guard, syscall.SIGTERM)
	t.Cleanup(func() { signal.Stop(guard) })
}

// sigtermSelf sends SIGTERM to this process: the in-process agent's
// shutdown, as a kubelet's or systemd's to the binary.
func sigtermSelf(t *testing.T) {
	t.Helper()
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
}

// fakeTrainer is the command line (after "--") of the tests' fake trainer,
// python/tests/faketrainer.py: a real trainer on the Python client over
// the real socket, its behaviours chosen by flags (see its doc). Every
// line it prints starts with "trainer: ".
func fakeTrainer(t *testing.T, flags ...string) []string {
	t.Helper()
	return append([]string{testPython, repoFile(t, "python/tests/faketrainer.py")}, flags...)
}

// outputTo is a trainer command line whose output (stdout and stderr)
// goes to the file log, which the test logs when it fails: an in-process
// agent's child would write to this test binary's own. The shell execs the
// trainer, which is the agent's child itself.
func outputTo(t *testing.T, log string, command []string) []string {
	t.Helper()
	t.Cleanup(func() {
		if b, err := os.ReadFile(log); t.Failed() && err == nil {
			t.Logf("%s:\n%s", filepath.Base(log), b)
		}
	})
	return append([]string{"/bin/sh", "-c", `exec "$@" >"$0" 2>&1`, log}, command...)
}

// fileLine waits up to within for a line of the file path that matches re
// and returns its submatches.
func fileLine(t *testing.T, path, re string, within time.Duration) []string {
	t.Helper()
	rx := regexp.MustCompile(`(?m)` + re)
	var m []string
	testutil.WaitWithin(t, "a line matching "+re+" in "+filepath.Base(path), within, func() bool {
		b, _ := os.ReadFile(path)
		m = rx.FindStringSubmatch(string(b))
		return m != nil
	})
	return m
}

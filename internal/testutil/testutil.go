// Package testutil holds what several packages' tests share: a short
// temporary directory (socket paths are limited to about 100 bytes), a
// bounded wait on a condition, never a sleep as synchronisation, a file
// written or read in one call, a small tmpfs (a disk that fills up) and a
// file store's snapshot (nothing written into it).
package testutil

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Wait bounds every wait of a test.
const Wait = 10 * time.Second

// ShortDir is a fresh temp dir with a short path, removed after the test:
// t.TempDir paths grow with the test name.
func ShortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "sa-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// WaitFor polls cond until it holds, failing the test after Wait.
func WaitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	WaitWithin(t, what, Wait, cond)
}

// WaitWithin polls cond until it holds, failing the test after timeout:
// WaitFor for the end-to-end tests, whose waits span processes (a trainer
// starting, a commit, a peer timeout) and take longer than Wait. It
// polls every timeout/2000, between 5 and 50 ms: a long wait's condition
// (an HTTP request, a scan of a process's output) is asked less often.
func WaitWithin(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	every := min(max(timeout/2000, 5*time.Millisecond), 50*time.Millisecond)
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(every) // polling a condition, bounded by deadline
	}
}

// WriteFile writes body at p, creating its parent directories.
func WriteFile(t *testing.T, p, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

// ReadFile is the contents of p.
func ReadFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// RequireEmptyDir fails the test unless dir is missing or empty: what a
// failed restore may leave (a .partial-* file or directory) is not there.
func RequireEmptyDir(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if len(names) > 0 {
		t.Fatalf("%s holds %v, want nothing", dir, names)
	}
}

// MkdirOwned makes the directory p with mode (past the umask), owned by
// uid (and gid uid), and returns p: another user's directory, for the
// tests of who may change a path. They run as root, as CI does.
func MkdirOwned(t *testing.T, p string, mode os.FileMode, uid int) string {
	t.Helper()
	if err := os.Mkdir(p, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p, uid, uid); err != nil {
		t.Fatal(err)
	}
	return p
}

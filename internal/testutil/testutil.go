// Package testutil holds what several packages' tests share: a short
// temporary directory (socket paths are limited to about 100 bytes) and a
// bounded wait on a condition, never a sleep as synchronisation.
package testutil

import (
	"os"
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
	deadline := time.Now().Add(Wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // polling a condition, bounded by deadline
	}
}

package supervisor

import (
	"os"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/child"
)

const testWait = 10 * time.Second

// shortDir is a fresh temp dir with a short path: socket paths are limited
// to about 100 bytes, and t.TempDir paths grow with the test name.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "sa-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// waitFor polls cond until it holds or testWait passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testWait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The agent's children run with a guard: a copy of this test binary
// started with child.GuardArg, which must become the guard at once.
func init() { child.RunGuardIfAsked() }

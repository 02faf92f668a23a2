package supervisor

import (
	"testing"

	"github.com/spotagent/spotagent/internal/child"
	"github.com/spotagent/spotagent/internal/testutil"
)

const testWait = testutil.Wait

// shortDir is a fresh temp dir with a short path: socket paths are limited
// to about 100 bytes, and t.TempDir paths grow with the test name.
func shortDir(t *testing.T) string {
	t.Helper()
	return testutil.ShortDir(t)
}

// The agent's children run with a guard: a copy of this test binary
// started with child.GuardArg, which must become the guard at once.
func init() { child.RunGuardIfAsked() }

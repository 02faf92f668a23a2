package child

import (
	"os"
	"testing"

	"github.com/spotagent/spotagent/internal/testutil"
)

const testWait = testutil.Wait

func TestMain(m *testing.M) {
	if pidFile := os.Getenv(parentHelperEnv); pidFile != "" {
		os.Exit(parentHelper(pidFile))
	}
	os.Exit(m.Run())
}

// shortDir is a fresh temp dir with a short path.
func shortDir(t *testing.T) string {
	t.Helper()
	return testutil.ShortDir(t)
}

// waitFor polls cond until it holds or testWait passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testutil.WaitFor(t, what, cond)
}

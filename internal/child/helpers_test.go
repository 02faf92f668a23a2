package child

import (
	"os"
	"testing"
	"time"
)

const testWait = 10 * time.Second

func TestMain(m *testing.M) {
	if pidFile := os.Getenv(parentHelperEnv); pidFile != "" {
		os.Exit(parentHelper(pidFile))
	}
	os.Exit(m.Run())
}

// shortDir is a fresh temp dir with a short path.
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
		time.Sleep(5 * time.Millisecond) // polling a condition, bounded by deadline
	}
}

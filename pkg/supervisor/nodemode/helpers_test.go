package nodemode

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/metadata"
)

// The helpers below are pkg/supervisor's test helpers that node mode's
// tests use (agent_test.go there): a notice source the test feeds. The
// trainer reduced to its socket is internal/testutil/trainertest.

const testWait = testutil.Wait

// shortDir is a fresh temp dir with a short path: socket paths are limited
// to about 100 bytes, and t.TempDir paths grow with the test name.
func shortDir(t *testing.T) string {
	t.Helper()
	return testutil.ShortDir(t)
}

// fakeSource delivers notices the test pushes.
type fakeSource struct{ ch chan metadata.Notice }

func (f *fakeSource) Cloud() metadata.Cloud { return metadata.CloudAWS }
func (f *fakeSource) Identity(context.Context) (metadata.Identity, error) {
	return metadata.Identity{Cloud: metadata.CloudAWS}, nil
}
func (f *fakeSource) Watch(ctx context.Context, out chan<- metadata.Notice) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case n := <-f.ch:
			out <- n
		}
	}
}

func mustWrite(t *testing.T, p, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

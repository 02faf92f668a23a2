package restore

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/spotagent/spotagent/internal/testsrv/s3test"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/cloudtest"
	"github.com/spotagent/spotagent/pkg/cloud/file"
	"github.com/spotagent/spotagent/pkg/cloud/s3"
)

// The restore tests commit what they restore: these helpers are the commit
// package tests' own (commit_test.go, lease_test.go there), the commit
// helper named commitFiles beside the package it calls.

func newStore(t *testing.T) *file.Store {
	t.Helper()
	st, err := file.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// writeDir creates a checkpoint directory holding files.
func writeDir(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, body := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func commitFiles(t *testing.T, st cloud.Store, step int64, id string, files map[string]string) *commit.Result {
	t.Helper()
	c := &commit.Committer{Store: st, RunID: "run"}
	res, err := c.Commit(context.Background(), commit.Request{Dir: writeDir(t, files), ID: id, Step: step, Reason: "periodic", Metadata: []byte(`{"epoch":1}`)})
	if err != nil {
		t.Fatalf("commit %s: %v", id, err)
	}
	return res
}

// leaseStores runs fn against the file store and the in-process S3 fake:
// the conditional writes fencing relies on differ most between them.
func leaseStores(t *testing.T, fn func(t *testing.T, st cloud.Store)) {
	t.Run("file", func(t *testing.T) { fn(t, newStore(t)) })
	t.Run("s3", func(t *testing.T) {
		srv := s3test.New(t)
		st, err := s3.New(t.Context(), srv.Bucket, cloudtest.Prefix(), s3.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		fn(t, st)
	})
}

func acquire(t *testing.T, st cloud.Store, session string) *checkpoint.Lease {
	t.Helper()
	l, err := checkpoint.AcquireLease(context.Background(), st, checkpoint.LeaseRecord{Session: session})
	if err != nil {
		t.Fatalf("acquire %s: %v", session, err)
	}
	return l
}

func commitUnder(l *checkpoint.Lease, st cloud.Store, t *testing.T, step int64, id string) (*commit.Result, error) {
	c := &commit.Committer{Store: st, RunID: "run", Lease: l}
	return c.Commit(context.Background(), commit.Request{Dir: writeDir(t, map[string]string{"w": id}), ID: id, Step: step, Reason: "periodic"})
}

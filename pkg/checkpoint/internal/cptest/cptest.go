// Package cptest holds test helpers shared by the checkpoint packages'
// tests (commit, restore, journal): stores, checkpoint directories, an
// object put as is, leases. It imports neither commit nor restore, so that
// their own (internal) tests can import it without an import cycle; the
// helpers that commit or restore stay in those packages' tests.
package cptest

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spotagent/spotagent/internal/testsrv/s3test"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/cloudtest"
	"github.com/spotagent/spotagent/pkg/cloud/file"
	"github.com/spotagent/spotagent/pkg/cloud/s3"
)

// NewStore is a file store in a fresh temp dir.
func NewStore(t *testing.T) *file.Store {
	t.Helper()
	st, err := file.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// WriteDir creates a checkpoint directory holding files (slash-separated
// names to contents).
func WriteDir(t *testing.T, files map[string]string) string {
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

// Put writes body at key as is, outside any commit.
func Put(t *testing.T, st cloud.Store, key, body string) {
	t.Helper()
	if err := st.Put(context.Background(), key, strings.NewReader(body), int64(len(body)), cloud.PutOptions{}); err != nil {
		t.Fatal(err)
	}
}

// LeaseStores runs fn against the file store and the in-process S3 fake:
// the conditional writes fencing relies on differ most between them.
func LeaseStores(t *testing.T, fn func(t *testing.T, st cloud.Store)) {
	t.Run("file", func(t *testing.T) { fn(t, NewStore(t)) })
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

// Acquire takes the run's lease for session.
func Acquire(t *testing.T, st cloud.Store, session string) *checkpoint.Lease {
	t.Helper()
	l, err := checkpoint.AcquireLease(context.Background(), st, checkpoint.LeaseRecord{Session: session})
	if err != nil {
		t.Fatalf("acquire %s: %v", session, err)
	}
	return l
}

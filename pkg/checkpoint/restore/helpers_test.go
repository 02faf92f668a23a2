package restore

import (
	"context"
	"testing"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/checkpoint/internal/cptest"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// The restore tests commit what they restore. commitFiles and commitUnder
// are the commit package tests' commit and commitUnder (commit_test.go,
// lease_test.go there), kept twice: a package that imports commit cannot
// serve commit's own tests (an import cycle). What needs neither package
// is shared: pkg/checkpoint/internal/cptest.

func commitFiles(t *testing.T, st cloud.Store, step int64, id string, files map[string]string) *commit.Result {
	t.Helper()
	c := &commit.Committer{Store: st, RunID: "run"}
	res, err := c.Commit(context.Background(), commit.Request{Dir: cptest.WriteDir(t, files), ID: id, Step: step, Reason: "periodic", Metadata: []byte(`{"epoch":1}`)})
	if err != nil {
		t.Fatalf("commit %s: %v", id, err)
	}
	return res
}

func commitUnder(l *checkpoint.Lease, st cloud.Store, t *testing.T, step int64, id string) (*commit.Result, error) {
	c := &commit.Committer{Store: st, RunID: "run", Lease: l}
	return c.Commit(context.Background(), commit.Request{Dir: cptest.WriteDir(t, map[string]string{"w": id}), ID: id, Step: step, Reason: "periodic"})
}

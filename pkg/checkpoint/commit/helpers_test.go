package commit

import (
	"context"
	"testing"

	"github.com/spotagent/spotagent/pkg/checkpoint/restore"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// The step restore picks; restore's own tests have it too (restore_test.go
// there): a shared package that imports restore cannot serve them. What
// needs neither package is pkg/checkpoint/internal/cptest.

func restoredStep(t *testing.T, st cloud.Store) int64 {
	t.Helper()
	r, err := restore.Checkpoint(context.Background(), st, t.TempDir(), restore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return r.Manifest.Step
}

package commit

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/spotagent/spotagent/pkg/checkpoint/restore"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// Helpers the commit tests share with pkg/checkpoint/restore's
// (restore_test.go there): an object put as is, the step restore picks.

func put(t *testing.T, st cloud.Store, key, body string) {
	t.Helper()
	if err := st.Put(context.Background(), key, strings.NewReader(body), int64(len(body)), cloud.PutOptions{}); err != nil {
		t.Fatal(err)
	}
}

func restoredStep(t *testing.T, st cloud.Store) int64 {
	t.Helper()
	r, err := restore.Checkpoint(context.Background(), st, t.TempDir(), restore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return r.Manifest.Step
}

func readString(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

package journal

import (
	"testing"

	"github.com/spotagent/spotagent/pkg/cloud/file"
)

func newStore(t *testing.T) *file.Store {
	t.Helper()
	st, err := file.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

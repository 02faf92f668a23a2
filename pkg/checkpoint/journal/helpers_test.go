package journal

import (
	"context"
	"strings"
	"testing"

	"github.com/spotagent/spotagent/pkg/cloud"
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

func put(t *testing.T, st cloud.Store, key, body string) {
	t.Helper()
	if err := st.Put(context.Background(), key, strings.NewReader(body), int64(len(body)), cloud.PutOptions{}); err != nil {
		t.Fatal(err)
	}
}

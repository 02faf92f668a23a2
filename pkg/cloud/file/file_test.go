package file_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/cloudtest"
	"github.com/spotagent/spotagent/pkg/cloud/file"
)

func TestConformance(t *testing.T) {
	cloudtest.Run(t, func(t *testing.T) cloud.Store {
		st, err := file.New(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return st
	})
}

func TestCleanup(t *testing.T) {
	dir := t.TempDir()
	st, err := file.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := st.Put(ctx, "ck/a", strings.NewReader("a"), 1, cloud.PutOptions{}); err != nil {
		t.Fatal(err)
	}
	// What a writer killed between create and rename leaves behind.
	for _, p := range []string{".spotagent-tmp-123", "ck/.spotagent-tmp-456"} {
		if err := os.WriteFile(filepath.Join(dir, p), []byte("partial"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	n, err := st.Cleanup(ctx)
	if err != nil || n != 2 {
		t.Fatalf("cleanup=%d, %v; want 2, nil", n, err)
	}
	if n, _ := st.Cleanup(ctx); n != 0 {
		t.Fatalf("second cleanup=%d, want 0", n)
	}
	if _, err := st.Stat(ctx, "ck/a"); err != nil {
		t.Fatalf("cleanup removed an object: %v", err)
	}
}

func TestReservedAndInvalidKeys(t *testing.T) {
	st, err := file.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"", "/abs", "a/../b", "./a", "a//b", ".spotagent-tmp-x", "d/.spotagent-lock"} {
		if err := st.Put(context.Background(), k, strings.NewReader("x"), 1, cloud.PutOptions{}); err == nil {
			t.Errorf("put %q succeeded, want an error", k)
		}
	}
}

func TestURI(t *testing.T) {
	dir := t.TempDir()
	st, err := file.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := st.URI("a/b"), "file://"+dir+"/a/b"; got != want {
		t.Fatalf("URI=%q, want %q", got, want)
	}
}

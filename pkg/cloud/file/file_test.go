package file_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

// With options, cleanup removes only the temp files the options own, and
// those older than MaxAge: another agent's writes in flight are spared.
func TestCleanup_Owned(t *testing.T) {
	dir := t.TempDir()
	st, err := file.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	mine := filepath.Join("ck", "node-1", ".spotagent-tmp-1")
	theirs := filepath.Join("ck", "node-0", ".spotagent-tmp-2")
	old := filepath.Join("ck", "node-0", ".spotagent-tmp-3")
	for _, p := range []string{mine, theirs, old} {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, p), []byte("partial"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	day := time.Now().Add(-25 * time.Hour)
	if err := os.Chtimes(filepath.Join(dir, old), day, day); err != nil {
		t.Fatal(err)
	}
	opts := cloud.CleanupOptions{Owned: func(key string) bool { return strings.HasPrefix(key, "ck/node-1/") }}
	if n, err := st.Cleanup(context.Background(), opts); err != nil || n != 2 {
		t.Fatalf("cleanup=%d, %v; want 2, nil", n, err)
	}
	if _, err := os.Stat(filepath.Join(dir, theirs)); err != nil {
		t.Fatalf("cleanup removed another writer's temp file: %v", err)
	}
}

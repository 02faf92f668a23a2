package restore

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/checkpoint/internal/cptest"
)

// dirNames lists dir's entries (recursively, slash-separated).
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	var names []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		names = append(names, filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}

func TestRestoreDir(t *testing.T) {
	ctx := context.Background()
	st := cptest.NewStore(t)
	commitFiles(t, st, 10, "a", map[string]string{"model.pt": "ten", "opt/state": "s10"})
	commitFiles(t, st, 20, "b", map[string]string{"model.pt": "twenty", "opt/state": "s20"})
	want := []string{"model.pt", "opt", "opt/state"}

	t.Run("Missing", func(t *testing.T) {
		dest := filepath.Join(t.TempDir(), "a", "dest")
		r, err := Dir(ctx, st, dest, false, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if got := dirNames(t, dest); !slices.Equal(got, want) {
			t.Fatalf("dest holds %q, want %q (the files directly)", got, want)
		}
		if got, want := testutil.ReadFile(t, filepath.Join(dest, "model.pt")), "twenty"; got != want {
			t.Fatalf("model.pt=%q, want %q", got, want)
		}
		if r.Dir != dest || r.Manifest.ID != "b" {
			t.Fatalf("Dir=%q ID=%q, want %q and b", r.Dir, r.Manifest.ID, dest)
		}
		if got := dirNames(t, filepath.Dir(dest)); !slices.Equal(got, []string{"dest", "dest/model.pt", "dest/opt", "dest/opt/state"}) {
			t.Fatalf("staging left beside dest: %q", got)
		}
	})
	t.Run("Empty", func(t *testing.T) {
		dest := t.TempDir()
		if err := os.Chmod(dest, 0o750); err != nil {
			t.Fatal(err)
		}
		if _, err := Dir(ctx, st, dest, false, Options{ID: "a"}); err != nil {
			t.Fatal(err)
		}
		if got := testutil.ReadFile(t, filepath.Join(dest, "model.pt")); got != "ten" {
			t.Fatalf("model.pt=%q, want ten (--id a)", got)
		}
		if fi, _ := os.Stat(dest); fi.Mode().Perm() != 0o750 {
			t.Fatalf("dest mode %v, want the old 0750", fi.Mode().Perm())
		}
	})
	t.Run("NotEmpty", func(t *testing.T) {
		dest := t.TempDir()
		if err := os.WriteFile(filepath.Join(dest, "mine"), []byte("keep"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := Dir(ctx, st, dest, false, Options{})
		if !errors.Is(err, ErrDestNotEmpty) {
			t.Fatalf("err=%v, want ErrDestNotEmpty", err)
		}
		if got := dirNames(t, dest); !slices.Equal(got, []string{"mine"}) {
			t.Fatalf("dest holds %q after a refusal, want it untouched", got)
		}
	})
	t.Run("Replace", func(t *testing.T) {
		parent := t.TempDir()
		dest := filepath.Join(parent, "dest")
		if err := os.MkdirAll(filepath.Join(dest, "old"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dest, "model.pt"), []byte("stale"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Dir(ctx, st, dest, true, Options{}); err != nil {
			t.Fatal(err)
		}
		if got := dirNames(t, dest); !slices.Equal(got, want) {
			t.Fatalf("dest holds %q, want only the checkpoint's %q", got, want)
		}
		if got := dirNames(t, parent); len(got) != 4 {
			t.Fatalf("left beside dest: %q", got)
		}
	})
	t.Run("ReplaceFailsKeepsOld", func(t *testing.T) {
		dest := t.TempDir()
		if err := os.WriteFile(filepath.Join(dest, "mine"), []byte("keep"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := Dir(ctx, st, dest, true, Options{ID: "no-such-id"})
		if !errors.Is(err, ErrNoCheckpoint) {
			t.Fatalf("err=%v, want ErrNoCheckpoint", err)
		}
		if got := dirNames(t, dest); !slices.Equal(got, []string{"mine"}) {
			t.Fatalf("dest holds %q after a failed restore, want it untouched", got)
		}
		if got := dirNames(t, filepath.Dir(dest)); len(got) != 2 {
			t.Fatalf("staging left beside dest: %q", got)
		}
	})
	t.Run("NotADirectory", func(t *testing.T) {
		dest := filepath.Join(t.TempDir(), "f")
		if err := os.WriteFile(dest, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Dir(ctx, st, dest, true, Options{}); err == nil {
			t.Fatal("restored over a file")
		}
	})
}

package checkpoint

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestCommit_OwnedBy: a checkpoint directory of a trainer running as
// another user (uid 4242) is committed only with files of that user and
// one link each: a file owned by root, or a hard link to any file, is
// refused, so the trainer cannot read back through the store what only
// the agent may read.
func TestCommit_OwnedBy(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: files of another user")
	}
	const uid = 4242
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, dir string)
		ok    bool
	}{
		{"own files", func(t *testing.T, dir string) {}, true},
		{"root's file", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, "secret"), []byte("root only"), 0o600)
		}, false},
		{"hard link", func(t *testing.T, dir string) {
			other := filepath.Join(t.TempDir(), "shadow")
			os.WriteFile(other, []byte("root only"), 0o600)
			os.Chown(other, uid, uid) // even a file of its own: a link is refused
			if err := os.Link(other, filepath.Join(dir, "linked")); err != nil {
				t.Skip("no hard links here:", err)
			}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := newStore(t)
			dir := writeDir(t, map[string]string{"model.pt": "weights"})
			os.Chown(filepath.Join(dir, "model.pt"), uid, uid)
			tc.plant(t, dir)
			root, err := os.OpenRoot(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer root.Close()
			defer OwnedBy(root, uid)()
			c := &Committer{Store: st, RunID: "run"}
			_, err = c.Commit(context.Background(), Request{Dir: dir, Root: root, ID: "a", Step: 1})
			if tc.ok && err != nil {
				t.Fatalf("commit of the trainer's own files: %v", err)
			}
			if !tc.ok && !errors.Is(err, ErrRefused) {
				t.Fatalf("commit err=%v, want ErrRefused", err)
			}
		})
	}
	// Not marked: no owner rule (the agent's own user's trainer).
	st := newStore(t)
	dir := writeDir(t, map[string]string{"model.pt": "weights"})
	if _, err := (&Committer{Store: st, RunID: "run"}).Commit(context.Background(), Request{Dir: dir, ID: "b", Step: 1}); err != nil {
		t.Fatal(err)
	}
}

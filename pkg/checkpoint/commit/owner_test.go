package commit

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/internal/cptest"
	"github.com/spotagent/spotagent/pkg/cloud"
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
			st := cptest.NewStore(t)
			dir := cptest.WriteDir(t, map[string]string{"model.pt": "weights"})
			os.Chown(filepath.Join(dir, "model.pt"), uid, uid)
			tc.plant(t, dir)
			root, err := os.OpenRoot(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer root.Close()
			c := &Committer{Store: st, RunID: "run"}
			_, err = c.Commit(context.Background(), Request{Dir: dir, Root: root, ID: "a", Step: 1, Owners: []int{uid}})
			if tc.ok && err != nil {
				t.Fatalf("commit of the trainer's own files: %v", err)
			}
			if !tc.ok && !errors.Is(err, checkpoint.ErrRefused) {
				t.Fatalf("commit err=%v, want ErrRefused", err)
			}
		})
	}
	// No Owners: no owner rule (the agent's own user's trainer).
	st := cptest.NewStore(t)
	dir := cptest.WriteDir(t, map[string]string{"model.pt": "weights"})
	if _, err := (&Committer{Store: st, RunID: "run"}).Commit(context.Background(), Request{Dir: dir, ID: "b", Step: 1}); err != nil {
		t.Fatal(err)
	}
}

// TestPipeline_OwnedBy: a file reported saved by a trainer of another
// user (uid 4242) is uploaded early only if it is that user's, with one
// link. A hard link to a root-only file (fs.protected_hardlinks=0), or a
// root-owned file, is never read: nothing of it reaches the store, every
// later Add fails, and so does the commit at done, even once the file is
// gone; the early uploads of the trainer's own files are deleted by the
// Abort that follows. A file of its own reported saved and then replaced
// by such a link before done is refused by the commit (Request.Owners).
func TestPipeline_OwnedBy(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: files of another user")
	}
	const uid = 4242
	secret := filepath.Join(t.TempDir(), "shadow")
	if err := os.WriteFile(secret, []byte("root only"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, dir string) // writes "x"
	}{
		{"hard link to a root-only file", func(t *testing.T, dir string) {
			if err := os.Link(secret, filepath.Join(dir, "x")); err != nil {
				t.Fatal(err)
			}
		}},
		{"root's file", func(t *testing.T, dir string) {
			if err := os.WriteFile(filepath.Join(dir, "x"), []byte("root only"), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &countingStore{Store: cptest.NewStore(t)}
			dir := cptest.WriteDir(t, map[string]string{"model.pt": "weights"})
			if err := os.Chown(filepath.Join(dir, "model.pt"), uid, uid); err != nil {
				t.Fatal(err)
			}
			tc.plant(t, dir)
			root := openRoot(t, dir)
			c := &Committer{Store: st, RunID: "run"}
			p := c.NewPipeline(context.Background(), root, 3, "own")
			if err := p.Add("model.pt", uid); err != nil {
				t.Fatalf("add the trainer's own file: %v", err)
			}
			err := p.Add("x", uid)
			if !errors.Is(err, checkpoint.ErrNotOwned) {
				t.Fatalf("add x: %v, want ErrNotOwned", err)
			}
			if n := st.count(checkpoint.Prefix(3, "own") + "x"); n != 0 {
				t.Fatalf("x was put %d times: the refused file reached the store", n)
			}
			if err := p.Add("model.pt", uid); err == nil || !errors.Is(err, checkpoint.ErrNotOwned) {
				t.Fatalf("add after a refusal: %v, want the refusal", err)
			}
			// Even with x gone by done, the checkpoint is not committed.
			os.Remove(filepath.Join(dir, "x"))
			if _, err := c.Commit(context.Background(), Request{Root: root, ID: "own", Step: 3, Pipeline: p, Owners: []int{uid}}); !errors.Is(err, checkpoint.ErrNotOwned) {
				t.Fatalf("commit: %v, want ErrNotOwned", err)
			}
			p.Abort()
			p.Wait()
			var left []string
			st.List(context.Background(), "", func(o cloud.ObjectInfo) error { left = append(left, o.Key); return nil })
			if len(left) > 0 {
				t.Fatalf("objects left after the refused checkpoint: %v", left)
			}
		})
	}
	t.Run("replaced after saved", func(t *testing.T) {
		st := &countingStore{Store: cptest.NewStore(t)}
		dir := cptest.WriteDir(t, map[string]string{"model.pt": "weights"})
		if err := os.Chown(filepath.Join(dir, "model.pt"), uid, uid); err != nil {
			t.Fatal(err)
		}
		root := openRoot(t, dir)
		c := &Committer{Store: st, RunID: "run"}
		p := c.NewPipeline(context.Background(), root, 3, "rep")
		if err := p.Add("model.pt", uid); err != nil {
			t.Fatal(err)
		}
		tmp := filepath.Join(dir, ".tmp")
		if err := os.Link(secret, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "model.pt")); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Commit(context.Background(), Request{Root: root, ID: "rep", Step: 3, Pipeline: p, Owners: []int{uid}}); !errors.Is(err, checkpoint.ErrNotOwned) {
			t.Fatalf("commit: %v, want ErrNotOwned", err)
		}
		p.Abort()
		p.Wait()
	})
}

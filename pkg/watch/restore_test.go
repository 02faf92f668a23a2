package watch

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/checkpoint/restore"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/file"
)

// committedDir commits a checkpoint-7 directory holding a.bin and b.bin
// to a new store, as watch mode does, and returns the store.
func committedDir(t *testing.T) cloud.Store {
	t.Helper()
	st, err := file.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	w, _ := newWatcher(t, Config{Marker: markerNone})
	testutil.WriteFile(t, filepath.Join(w.cfg.Dir, "checkpoint-7", "a.bin"), "aaaa")
	testutil.WriteFile(t, filepath.Join(w.cfg.Dir, "checkpoint-7", "b.bin"), "bbbb")
	t0 := time.Now()
	w.Scan(t0)
	cps := w.Scan(t0.Add(time.Hour))
	if len(cps) != 1 {
		t.Fatal("not complete")
	}
	commitOne(t, st, cps[0], "c7")
	return st
}

// restoreWithin runs w.Restore and fails the test if it has not returned
// within a deadline (a FIFO opened for reading would block it for ever).
func restoreWithin(t *testing.T, w *Watcher, st cloud.Store) (*Restored, error) {
	t.Helper()
	type result struct {
		r   *Restored
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := w.Restore(t.Context(), st, restore.Options{})
		done <- result{r, err}
	}()
	select {
	case res := <-done:
		return res.r, res.err
	case <-time.After(20 * time.Second):
		t.Fatal("restore blocked")
		return nil, nil
	}
}

func entries(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var n []string
	for _, e := range ents {
		n = append(n, e.Name())
	}
	return n
}

// TestRestore_FIFOSwappedIn: a file of the local copy swapped for a FIFO
// after the listing, before it is read, is not read: the restore returns,
// and the copy is moved aside for the verified one. (Opening it by path,
// as before, blocked the agent's start for ever.)
func TestRestore_FIFOSwappedIn(t *testing.T) {
	st := committedDir(t)
	dir := t.TempDir()
	local := filepath.Join(dir, "checkpoint-7")
	testutil.WriteFile(t, filepath.Join(local, "a.bin"), "aaaa")
	testutil.WriteFile(t, filepath.Join(local, "b.bin"), "bbbb")
	fifo := filepath.Join(local, "b.bin")
	testHookSameAs = func() {
		os.Remove(fifo)
		if err := syscall.Mkfifo(fifo, 0o600); err != nil {
			t.Error(err)
		}
	}
	defer func() { testHookSameAs = nil }()
	// Should the restore open the FIFO, a writer ends it once the test is over.
	defer func() {
		if f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
	}()
	w, logs := newWatcher(t, Config{Dir: dir, Marker: markerNone})
	r, err := restoreWithin(t, w, st)
	if err != nil {
		t.Fatal(err)
	}
	if got := testutil.ReadFile(t, filepath.Join(r.Path, "b.bin")); got != "bbbb" {
		t.Fatalf("restored b.bin %q", got)
	}
	if logs.FilterMessage("moved a local checkpoint aside").Len() != 1 {
		t.Fatalf("the copy holding a FIFO was not moved aside: %v", logs.All())
	}
	if n := entries(t, dir); len(n) != 2 {
		t.Fatalf("DIR holds %v, want the restored checkpoint and the one moved aside", n)
	}
}

// TestRestore_SymlinkOut: a symlink at DIR/<name> to a directory outside
// DIR holding the same files is not taken for the checkpoint, and nothing
// outside DIR is read or written: the link is moved aside.
func TestRestore_SymlinkOut(t *testing.T) {
	st := committedDir(t)
	outside := t.TempDir()
	testutil.WriteFile(t, filepath.Join(outside, "a.bin"), "aaaa")
	testutil.WriteFile(t, filepath.Join(outside, "b.bin"), "bbbb")
	dir := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(dir, "checkpoint-7")); err != nil {
		t.Fatal(err)
	}
	w, logs := newWatcher(t, Config{Dir: dir, Marker: markerNone})
	r, err := restoreWithin(t, w, st)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(r.Path); err != nil || !fi.IsDir() {
		t.Fatalf("DIR/checkpoint-7 is not the restored directory: %v %v", fi, err)
	}
	if logs.FilterMessage("moved a local checkpoint aside").Len() != 1 {
		t.Fatalf("the symlink was not moved aside: %v", logs.All())
	}
	if n := entries(t, outside); len(n) != 2 {
		t.Fatalf("outside DIR: %v", n)
	}
}

// TestRestore_DirSwapped: DIR renamed away and replaced by a symlink to
// another directory after the watcher opened it (a sidecar's trainer can
// do that before the agent restores): the restore goes into the directory
// the watcher opened, and nothing is written where the symlink points.
func TestRestore_DirSwapped(t *testing.T) {
	st := committedDir(t)
	parent, outside := t.TempDir(), t.TempDir()
	dir := filepath.Join(parent, "watch")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	w, _ := newWatcher(t, Config{Dir: dir, Marker: markerNone})
	moved := filepath.Join(parent, "moved")
	if err := os.Rename(dir, moved); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, dir); err != nil {
		t.Fatal(err)
	}
	if _, err := restoreWithin(t, w, st); err != nil {
		t.Fatal(err)
	}
	if n := entries(t, outside); len(n) != 0 {
		t.Fatalf("the restore wrote outside the watched directory: %v", n)
	}
	if got := testutil.ReadFile(t, filepath.Join(moved, "checkpoint-7", "a.bin")); got != "aaaa" {
		t.Fatalf("restored a.bin %q", got)
	}
}

// TestRestore_SameKept: a local copy that verifies is kept as it is (the
// very same files), and no temporary directory is left behind.
func TestRestore_SameKept(t *testing.T) {
	st := committedDir(t)
	dir := t.TempDir()
	testutil.WriteFile(t, filepath.Join(dir, "checkpoint-7", "a.bin"), "aaaa")
	testutil.WriteFile(t, filepath.Join(dir, "checkpoint-7", "b.bin"), "bbbb")
	before, err := os.Lstat(filepath.Join(dir, "checkpoint-7", "a.bin"))
	if err != nil {
		t.Fatal(err)
	}
	w, logs := newWatcher(t, Config{Dir: dir, Marker: markerNone})
	if _, err := restoreWithin(t, w, st); err != nil {
		t.Fatal(err)
	}
	after, err := os.Lstat(filepath.Join(dir, "checkpoint-7", "a.bin"))
	if err != nil || !os.SameFile(before, after) {
		t.Fatalf("the verified local copy was replaced (%v)", err)
	}
	if logs.FilterMessage("checkpoint already in the watched directory and verified: not replacing it").Len() != 1 {
		t.Fatalf("logs %v", logs.All())
	}
	if n := entries(t, dir); len(n) != 1 {
		t.Fatalf("DIR holds %v, want checkpoint-7 alone", n)
	}
}

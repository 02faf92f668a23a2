package commit

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/internal/cptest"
	"github.com/spotagent/spotagent/pkg/checkpoint/restore"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// Issue 13: what a hostile trainer can do to a commit or a restore through
// its checkpoint directory, and a hostile or broken store through manifests.

// commitBehindGate starts a commit of dir that scans, then waits for the
// gate's only slot, held by the test: whatever the test does to dir before
// calling the returned release happens between the scan and the upload.
func commitBehindGate(t *testing.T, st cloud.Store, dir string, step int64, id string) (release func(), done <-chan error) {
	t.Helper()
	g := NewGate(1)
	_, hold, err := g.Acquire(context.Background(), Claim{})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		c := &Committer{Store: st, RunID: "run", Gate: g}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := c.Commit(ctx, Request{Dir: dir, ID: id, Step: step, Reason: "periodic"})
		errc <- err
	}()
	waitGate(t, g, 1) // scanned, waiting for the slot
	return hold, errc
}

// TestCommit_FIFOSwappedInAfterScan (item 2): a file replaced by a FIFO
// after the scan fails the commit at once, naming it, instead of blocking
// in open(2) for ever.
func TestCommit_FIFOSwappedInAfterScan(t *testing.T) {
	st := cptest.NewStore(t)
	dir := cptest.WriteDir(t, map[string]string{"a": "weights", "z": "zz"})
	release, done := commitBehindGate(t, st, dir, 1, "fifo")
	z := filepath.Join(dir, "z")
	if err := os.Remove(z); err != nil {
		t.Fatal(err)
	}
	if err := mkfifo(z); err != nil {
		t.Fatal(err)
	}
	// On failure, unblock an open(2) stuck on the FIFO so the test ends.
	t.Cleanup(func() {
		if f, err := os.OpenFile(z, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
	})
	release()
	select {
	case err := <-done:
		if err == nil || !errors.Is(err, checkpoint.ErrRefused) || !strings.Contains(err.Error(), "z") {
			t.Fatalf("commit: %v, want a refusal naming z", err)
		}
	case <-time.After(gateWait):
		t.Fatal("commit blocked on a FIFO swapped in after the scan")
	}
	if _, err := checkpoint.ReadLatest(context.Background(), st); !errors.Is(err, cloud.ErrNotExist) {
		t.Fatalf("latest.json after a refused commit: %v", err)
	}
}

// TestCommit_DirSwappedForSymlink (item 3c): the checkpoint directory is
// renamed and a symlink to another directory with files of the same names
// and sizes put in its place between the scan and the upload. The commit
// uploads the original files or nothing, never the other directory's.
func TestCommit_DirSwappedForSymlink(t *testing.T) {
	st := cptest.NewStore(t)
	parent := t.TempDir()
	dir := filepath.Join(parent, "ck")
	os.Mkdir(dir, 0o700)
	os.WriteFile(filepath.Join(dir, "w"), []byte("mine"), 0o600)
	other := cptest.WriteDir(t, map[string]string{"w": "evil"})
	release, done := commitBehindGate(t, st, dir, 1, "swap")
	if err := os.Rename(dir, dir+".moved"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(other, dir); err != nil {
		t.Fatal(err)
	}
	release()
	if err := <-done; err != nil {
		return // nothing committed: acceptable
	}
	r, err := st.Get(context.Background(), "checkpoints/000000000001-swap/w", 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if b, _ := io.ReadAll(r); string(b) != "mine" {
		t.Fatalf("committed %q, want the original directory's %q", b, "mine")
	}
}

// TestCommit_NonUTF8Name (item 4): a file name that is not UTF-8 refuses
// the commit, naming the file (escaped); JSON would have changed it.
func TestCommit_NonUTF8Name(t *testing.T) {
	st := cptest.NewStore(t)
	dir := cptest.WriteDir(t, map[string]string{"ok": "x"})
	if err := os.WriteFile(filepath.Join(dir, "caf\xe9"), []byte("y"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &Committer{Store: st, RunID: "run"}
	_, err := c.Commit(context.Background(), Request{Dir: dir, ID: "utf", Step: 1, Reason: "periodic"})
	if err == nil || !errors.Is(err, checkpoint.ErrRefused) || !strings.Contains(err.Error(), `caf\xe9`) || !strings.Contains(err.Error(), "UTF-8") {
		t.Fatalf("commit: %v, want a refusal naming caf\\xe9", err)
	}
	if _, err := checkpoint.ReadLatest(context.Background(), st); !errors.Is(err, cloud.ErrNotExist) {
		t.Fatalf("latest.json after a refused commit: %v", err)
	}
}

func TestMarshalManifest_RoundTrip(t *testing.T) {
	m := &checkpoint.Manifest{Format: checkpoint.Format, ID: "x", Step: 1, Files: []checkpoint.File{{Path: "ok", Key: "checkpoints/000000000001-x/ok"}}}
	if _, err := marshalManifest(m); err != nil {
		t.Fatalf("a plain manifest: %v", err)
	}
	m.Files = append(m.Files, checkpoint.File{Path: "caf\xe9", Key: "checkpoints/000000000001-x/caf\xe9"})
	if _, err := marshalManifest(m); err == nil || !strings.Contains(err.Error(), `caf\xe9`) {
		t.Fatalf("a non-UTF-8 path: %v, want an error naming it", err)
	}
}

// TestRestore_NewerThanLatest (item 10): latest.json was not updated for
// the newest commit (its write failed): restore still resumes from the
// newest complete checkpoint, and falls back past a newer damaged one.
func TestRestore_NewerThanLatest(t *testing.T) {
	st := cptest.NewStore(t)
	commit(t, st, 10, "a", map[string]string{"m": "ten"})
	commit(t, st, 20, "b", map[string]string{"m": "twenty"})
	commit(t, st, 30, "c", map[string]string{"m": "thirty"})
	cptest.Put(t, st, checkpoint.LatestKey, `{"manifest":"checkpoints/000000000010-a/manifest.json","step":10,"id":"a"}`)
	if got := restoredStep(t, st); got != 30 {
		t.Fatalf("restored step %d, want 30 (newer than latest.json's 10)", got)
	}
	cptest.Put(t, st, "checkpoints/000000000030-c/m", "thirtx") // damaged
	r, err := restore.Checkpoint(context.Background(), st, t.TempDir(), restore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if r.Manifest.Step != 20 || len(r.Skipped) != 1 {
		t.Fatalf("restored step %d skipping %v, want 20 skipping the damaged 30", r.Manifest.Step, r.Skipped)
	}
}

// TestRestore_FileAndDirConflict (item 13): a manifest listing both "a"
// and "a/b" is skipped like any broken one: restore falls back to the
// older good checkpoint instead of aborting.
func TestRestore_FileAndDirConflict(t *testing.T) {
	st := cptest.NewStore(t)
	commit(t, st, 10, "good", map[string]string{"m": "ten"})
	res := commit(t, st, 20, "bad", map[string]string{"a": "x", "c/b": "y"})
	m := *res.Manifest
	m.Files = append([]checkpoint.File(nil), m.Files...)
	for i := range m.Files {
		if m.Files[i].Path == "c/b" {
			m.Files[i].Path = "a/b"
		}
	}
	body, _ := marshalManifest(&m)
	cptest.Put(t, st, res.ManifestKey, string(body))
	r, err := restore.Checkpoint(context.Background(), st, t.TempDir(), restore.Options{})
	if err != nil {
		t.Fatalf("restore aborted: %v", err)
	}
	if r.Manifest.Step != 10 || len(r.Skipped) != 1 || !strings.Contains(r.Skipped[0], "also the directory") {
		t.Fatalf("restored step %d skipping %v, want 10 skipping the conflicting manifest", r.Manifest.Step, r.Skipped)
	}
}

// TestRestore_SymlinkInDest (item 3a): a symlink planted where the
// checkpoint's directory goes is removed itself; its target is untouched.
func TestRestore_SymlinkInDest(t *testing.T) {
	st := cptest.NewStore(t)
	commit(t, st, 10, "a", map[string]string{"m": "ten"})
	dest := t.TempDir()
	victim := cptest.WriteDir(t, map[string]string{"precious": "keep"})
	if err := os.Symlink(victim, filepath.Join(dest, "000000000010-a")); err != nil {
		t.Fatal(err)
	}
	r, err := restore.Checkpoint(context.Background(), st, dest, restore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := testutil.ReadFile(t, filepath.Join(r.Dir, "m")); got != "ten" {
		t.Fatalf("restored %q", got)
	}
	if got := testutil.ReadFile(t, filepath.Join(victim, "precious")); got != "keep" {
		t.Fatalf("symlink target changed: %q", got)
	}
}

// TestPrune_Pinned (item 11): with keep 1, a checkpoint committed with a
// lower step than the newest survives retention when pinned.
func TestPrune_Pinned(t *testing.T) {
	st := cptest.NewStore(t)
	commit(t, st, 100, "new", map[string]string{"m": "100"})
	low := commit(t, st, 50, "low", map[string]string{"m": "50"})
	if _, err := checkpoint.Prune(context.Background(), st, 1, nil, low.ManifestKey); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{low.ManifestKey, checkpoint.ManifestKey(100, "new"), "checkpoints/000000000050-low/m"} {
		if _, err := st.Stat(context.Background(), k); err != nil {
			t.Fatalf("%s after prune: %v", k, err)
		}
	}
	if l, err := checkpoint.ReadLatest(context.Background(), st); err != nil || l.Step != 100 {
		t.Fatalf("latest %+v %v, want step 100", l, err)
	}
}

// TestOpenDir_RefusesSymlinks: no element of the path may be a symlink,
// even one that stays inside the parent.
func TestOpenDir_RefusesSymlinks(t *testing.T) {
	base := t.TempDir()
	os.MkdirAll(filepath.Join(base, "a", "b"), 0o700)
	os.Symlink("a", filepath.Join(base, "link"))
	root, err := os.OpenRoot(base)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	if d, err := checkpoint.OpenDir(root, "a/b"); err != nil {
		t.Fatalf("a/b: %v", err)
	} else {
		d.Close()
	}
	for _, p := range []string{"link", "link/b", "../x", "/a"} {
		if d, err := checkpoint.OpenDir(root, p); err == nil {
			d.Close()
			t.Fatalf("%s opened, want a refusal", p)
		}
	}
}

// TestWriteFile_NoFollow (item 3d): a symlink planted at the final name
// or where a fixed temp name would be is replaced, never followed.
func TestWriteFile_NoFollow(t *testing.T) {
	base := t.TempDir()
	victim := filepath.Join(t.TempDir(), "victim")
	os.WriteFile(victim, []byte("keep"), 0o600)
	os.Symlink(victim, filepath.Join(base, "request.json"))
	os.Symlink(victim, filepath.Join(base, "request.json.tmp"))
	root, err := os.OpenRoot(base)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	if err := checkpoint.WriteFile(root, "request.json", []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ReadFile(t, victim); got != "keep" {
		t.Fatalf("victim overwritten: %q", got)
	}
	if got := testutil.ReadFile(t, filepath.Join(base, "request.json")); got != "new" {
		t.Fatalf("request.json = %q", got)
	}
}

// TestRemoveDir_NeverTheRoot: a request with no directory of its own (an
// empty rel) must not empty the checkpoint directory.
func TestRemoveDir_NeverTheRoot(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "keep"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	for _, rel := range []string{"", ".", "./"} {
		if err := checkpoint.RemoveDir(root, rel, nil); !errors.Is(err, checkpoint.ErrRefused) {
			t.Fatalf("RemoveDir(%q) = %v, want ErrRefused", rel, err)
		}
		held, err := checkpoint.OpenDir(root, ".")
		if err != nil {
			t.Fatal(err)
		}
		if err := checkpoint.RemoveDir(root, rel, held); !errors.Is(err, checkpoint.ErrRefused) {
			t.Fatalf("RemoveDir(%q, held) = %v, want ErrRefused", rel, err)
		}
		held.Close()
	}
	if _, err := os.Stat(filepath.Join(dir, "keep")); err != nil {
		t.Fatalf("the root's contents were removed: %v", err)
	}
}

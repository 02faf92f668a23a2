package watch

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/checkpoint"
)

// trainerUID is the trainer's uid in these tests: another user than the
// agent (root).
const trainerUID = 4242

// chownAll gives everything below dir (dir too) to uid.
func chownAll(t *testing.T, dir string, uid int) {
	t.Helper()
	err := filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, uid)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// rootOwnedSecret is a root-only file (0600) on the filesystem of dir's
// parent, which a trainer could hard-link with fs.protected_hardlinks=0.
func rootOwnedSecret(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "shadow")
	if err := os.WriteFile(p, []byte("root only"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestOwner_WatchedDirOwner: a DIR of another user than the agent (root)
// is a trainer of that user's: a checkpoint of its own files is complete
// and stages (the agent's links, and a second staging of the same one,
// are no reason to refuse it), while one holding a hard link to a
// root-only file is refused once, with a warning, and never reported. A
// file given to root after the scan is refused when it is staged.
func TestOwner_WatchedDirOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: files of another user")
	}
	secret := rootOwnedSecret(t)
	dir := filepath.Join(filepath.Dir(secret), "out") // one filesystem: hard links
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	chownAll(t, dir, trainerUID)
	w, logs := newWatcher(t, Config{Dir: dir, Marker: markerNone})
	testutil.WriteFile(t, filepath.Join(dir, "checkpoint-1", "model.bin"), "weights")
	testutil.WriteFile(t, filepath.Join(dir, "checkpoint-2", "model.bin"), "weights")
	if err := os.Link(secret, filepath.Join(dir, "checkpoint-2", "x")); err != nil {
		t.Fatal(err)
	}
	testutil.WriteFile(t, filepath.Join(dir, "checkpoint-3", "model.bin"), "weights")
	chownAll(t, filepath.Join(dir, "checkpoint-1"), trainerUID)
	chownAll(t, filepath.Join(dir, "checkpoint-3"), trainerUID)
	os.Lchown(filepath.Join(dir, "checkpoint-2", "model.bin"), trainerUID, trainerUID)

	t0 := time.Now()
	w.Scan(t0)
	got := w.Scan(t0.Add(time.Hour))
	if names(got) != "checkpoint-1,checkpoint-3" {
		t.Fatalf("complete: %q, want checkpoint-1,checkpoint-3 (checkpoint-2 holds a root-only file)", names(got))
	}
	w.Scan(t0.Add(2 * time.Hour))
	var warned []string
	for _, e := range logs.FilterMessage("watched checkpoint not usable").All() {
		if why := e.ContextMap()["why"].(string); strings.Contains(why, "checkpoint-2/x is owned by uid 0, not by the trainer (uid 4242") {
			warned = append(warned, why)
		}
	}
	if len(warned) != 1 {
		t.Fatalf("warnings about checkpoint-2's x: %q, want one", warned)
	}
	if w.Pending(0) {
		t.Fatal("a refused checkpoint counts as pending")
	}
	// Staged twice (the agent's own links): still the trainer's files.
	stageIn(t, got[0], "a")
	stageIn(t, got[0], "b")
	// Given to root after the scan (the same inode): refused at staging.
	if err := os.Lchown(filepath.Join(dir, "checkpoint-3", "model.bin"), 0, 0); err != nil {
		t.Fatal(err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	if err := got[1].StageIn(root, ".stage/c"); !errors.Is(err, checkpoint.ErrNotOwned) {
		t.Fatalf("staging a root-owned file: %v, want ErrNotOwned", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, ".stage", "c")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the refused staging was left behind: %v", err)
	}
}

// TestOwner_WatchUID: --watch-uid names the trainer when DIR is the
// agent's (root's, writable by all, as an emptyDir): its files commit, a
// root-owned one is refused. Without it, DIR of the agent's own user
// means no rule, and a warning when others may write to DIR.
func TestOwner_WatchUID(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: files of another user")
	}
	uid := trainerUID
	w, _ := newWatcher(t, Config{Marker: markerNone, UID: &uid})
	testutil.WriteFile(t, filepath.Join(w.cfg.Dir, "checkpoint-1", "model.bin"), "weights")
	chownAll(t, filepath.Join(w.cfg.Dir, "checkpoint-1"), trainerUID)
	testutil.WriteFile(t, filepath.Join(w.cfg.Dir, "checkpoint-2", "model.bin"), "root's")
	t0 := time.Now()
	w.Scan(t0)
	if got := w.Scan(t0.Add(time.Hour)); names(got) != "checkpoint-1" {
		t.Fatalf("complete: %q, want checkpoint-1 (checkpoint-2 is root's)", names(got))
	}

	open := t.TempDir()
	if err := os.Chmod(open, 0o1777); err != nil {
		t.Fatal(err)
	}
	_, logs := newWatcher(t, Config{Dir: open, Marker: markerNone})
	if n := logs.FilterMessageSnippet("other users may write to it").Len(); n != 1 {
		t.Fatalf("%d warnings about a DIR others may write to, want 1", n)
	}
}

// TestOwner_RestoreGivesToTrainer: a checkpoint restored into a DIR of
// the trainer's is the trainer's (it may rotate it, and the owner rule
// does not refuse it), files and directories alike.
func TestOwner_RestoreGivesToTrainer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: files of another user")
	}
	st := committedDir(t)
	dir := t.TempDir()
	chownAll(t, dir, trainerUID)
	w, _ := newWatcher(t, Config{Dir: dir, Marker: markerNone})
	if _, err := restoreWithin(t, w, st); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"checkpoint-7", "checkpoint-7/a.bin", "checkpoint-7/b.bin"} {
		fi, err := os.Lstat(filepath.Join(dir, p))
		if err != nil {
			t.Fatal(err)
		}
		if uid := fi.Sys().(*syscall.Stat_t).Uid; uid != trainerUID {
			t.Errorf("%s restored owned by uid %d, want %d", p, uid, trainerUID)
		}
	}
	t0 := time.Now()
	w.Scan(t0)
	if got := w.Scan(t0.Add(time.Hour)); names(got) != "checkpoint-7" {
		t.Fatalf("the restored checkpoint: %q, want it complete, not refused", names(got))
	}
}

// TestOwner_AncestorsOfAnotherUser (a hostile-user trial's finding for
// --checkpoint-dir, held here for DIR): a DIR below a directory of a user
// other than root, the agent's and the trainer's is refused, and none of
// DIR's missing levels is made there (that user could rename DIR away and
// put theirs in its place: the trainer would save there and resume from
// what is planted there). The trainer's own parent (DIR's owner's, or
// --watch-uid's) is accepted; one writable by others without the sticky
// bit is warned of.
func TestOwner_AncestorsOfAnotherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: directories of other users")
	}
	const nobody = 65534
	base := testutil.ShortDir(t)
	if err := os.Chmod(base, os.ModeSticky|0o777); err != nil {
		t.Fatal(err)
	}
	mkdir := func(p string, mode os.FileMode, uid int) string {
		t.Helper()
		return testutil.MkdirOwned(t, p, mode, uid)
	}
	evil := mkdir(filepath.Join(base, "hx-evil"), 0o755, nobody)
	_, err := New(Config{Dir: filepath.Join(evil, "out", "hf")})
	if err == nil || !strings.Contains(err.Error(), evil+" is owned by uid 65534") {
		t.Fatalf("New below nobody's directory: %v, want a refusal naming it", err)
	}
	if _, err := os.Lstat(filepath.Join(evil, "out")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a level of DIR was made below nobody's directory: %v", err)
	}
	// The trainer's home and its DIR: the trainer's own.
	home := mkdir(filepath.Join(base, "home"), 0o755, trainerUID)
	mkdir(filepath.Join(home, "out"), 0o755, trainerUID)
	newWatcher(t, Config{Dir: filepath.Join(home, "out")})
	uid := trainerUID
	newWatcher(t, Config{Dir: filepath.Join(home, "new"), UID: &uid})
	// A writable parent, an emptyDir's: warned of.
	shared := mkdir(filepath.Join(base, "shared"), 0o777, 0)
	_, logs := newWatcher(t, Config{Dir: filepath.Join(shared, "out")})
	if w := logs.FilterMessageSnippet("above the watched directory is writable").All(); len(w) != 1 || w[0].ContextMap()["above"] != shared {
		t.Fatalf("%v, want one warning naming %s", logs.All(), shared)
	}
}

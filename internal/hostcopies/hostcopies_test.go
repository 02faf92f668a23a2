package hostcopies

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

type fixture struct {
	t    *testing.T
	dir  string
	root *os.Root
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	d := t.TempDir()
	r, err := os.OpenRoot(d)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return &fixture{t: t, dir: d, root: r}
}

// mk makes parts under the fixture with a file in it and returns its path.
func (f *fixture) mk(parts ...string) string {
	f.t.Helper()
	d := filepath.Join(append([]string{f.dir}, parts...)...)
	if err := os.MkdirAll(d, 0o755); err != nil {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "model.pt"), []byte("x"), 0o644); err != nil {
		f.t.Fatal(err)
	}
	return d
}

// age makes everything under d 30 days old.
func age(t *testing.T, d string) {
	t.Helper()
	old := time.Now().Add(-30 * 24 * time.Hour)
	ts := []unix.Timespec{unix.NsecToTimespec(old.UnixNano()), unix.NsecToTimespec(old.UnixNano())}
	filepath.Walk(d, func(p string, _ os.FileInfo, _ error) error {
		return unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW)
	})
}

func opts(ns, run string, node int) Options {
	uid := os.Getuid()
	if uid == 0 {
		uid = 1000 // the chart's trainer
	}
	return Options{Namespace: ns, Run: run, Node: node, UID: uid, GID: uid, Owner: os.Getuid(), Retain: 7 * 24 * time.Hour}
}

func exists(p string) bool { _, err := os.Lstat(p); return err == nil }

func TestPrepare_MakesAndHandsOver(t *testing.T) {
	f := newFixture(t)
	o := opts("team-a", "exp1", 3)
	res, err := Prepare(f.root, o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Dir != "team-a/exp1/node-3" {
		t.Errorf("dir %q", res.Dir)
	}
	fi, err := os.Lstat(filepath.Join(f.dir, "team-a", "exp1", "node-3"))
	if err != nil {
		t.Fatal(err)
	}
	if !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Errorf("mode %v, want a 0700 directory", fi.Mode())
	}
	if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != o.UID || int(st.Gid) != o.GID {
		t.Errorf("owned by %d:%d, want %d:%d", st.Uid, st.Gid, o.UID, o.GID)
	}
	for _, p := range []string{"team-a", "team-a/exp1"} {
		fi, _ := os.Lstat(filepath.Join(f.dir, p))
		if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != os.Getuid() || fi.Mode().Perm()&0o022 != 0 {
			t.Errorf("%s: uid %d mode %v: want the owner's alone", p, st.Uid, fi.Mode())
		}
	}
	// Again (the pod's restart): the same directory, what it holds kept.
	if err := os.WriteFile(filepath.Join(f.dir, res.Dir, "model.pt"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Prepare(f.root, o); err != nil {
		t.Fatal(err)
	}
	if !exists(filepath.Join(f.dir, res.Dir, "model.pt")) {
		t.Error("a second prepare emptied the directory")
	}
}

func TestPrepare_RefusesLinks(t *testing.T) {
	for _, at := range []string{"ns", "run", "node"} {
		t.Run(at, func(t *testing.T) {
			f := newFixture(t)
			victim := f.mk("team-c", "victim")
			if err := os.Chmod(victim, 0o755); err != nil {
				t.Fatal(err)
			}
			link := map[string]string{"ns": "team-d", "run": "team-d/exp1", "node": "team-d/exp1/node-0"}[at]
			if err := os.MkdirAll(filepath.Dir(filepath.Join(f.dir, link)), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(victim, filepath.Join(f.dir, link)); err != nil {
				t.Fatal(err)
			}
			_, err := Prepare(f.root, opts("team-d", "exp1", 0))
			if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "symbolic link") {
				t.Fatalf("a link at %s: %v, want refused", link, err)
			}
			fi, err := os.Stat(victim)
			if err != nil || fi.Mode().Perm() != 0o755 || int(fi.Sys().(*syscall.Stat_t).Uid) != os.Getuid() {
				t.Errorf("the link's target changed: %v %v", fi.Mode(), err)
			}
			if exists(filepath.Join(victim, "node-0")) || exists(filepath.Join(victim, "exp1")) {
				t.Error("made a directory through the link")
			}
		})
	}
}

func TestPrepare_RefusesWhatOthersMayWrite(t *testing.T) {
	for _, mode := range []os.FileMode{0o775, 0o757} {
		f := newFixture(t)
		if err := os.MkdirAll(filepath.Join(f.dir, "team-w", "exp1"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(f.dir, "team-w", "exp1"), mode); err != nil {
			t.Fatal(err)
		}
		_, err := Prepare(f.root, opts("team-w", "exp1", 0))
		if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "alone may write") {
			t.Errorf("run directory %v: %v, want refused", mode, err)
		}
		if fi, err := os.Lstat(filepath.Join(f.dir, "team-w", "exp1", "node-0")); err == nil && fi.Mode().Perm() == 0o700 {
			t.Errorf("run directory %v: handed over despite the refusal", mode)
		}
	}
	if os.Getuid() != 0 {
		return // only root can make a directory another uid owns
	}
	f := newFixture(t)
	if err := os.MkdirAll(filepath.Join(f.dir, "team-u", "exp1"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(f.dir, "team-u", "exp1"), 1000, 1000); err != nil {
		t.Fatal(err)
	}
	if _, err := Prepare(f.root, opts("team-u", "exp1", 0)); !errors.Is(err, ErrRefused) {
		t.Errorf("a run directory the trainer owns: %v, want refused", err)
	}
}

func TestPrepare_RemovesStaleRuns(t *testing.T) {
	f := newFixture(t)
	sameName := f.mk("team-b", "exp1", "node-0")
	stale := f.mk("team-b", "exp-old", "node-0")
	age(t, filepath.Join(f.dir, "team-b", "exp-old"))
	legacy := f.mk("exp-legacy", "node-0") // an earlier layout: <run>/node-<rank>
	age(t, filepath.Join(f.dir, "exp-legacy"))
	fresh := f.mk("team-a", "exp-fresh", "node-0")
	oldButNewFile := f.mk("team-a", "exp-slow", "node-0")
	age(t, filepath.Join(f.dir, "team-a", "exp-slow"))
	if err := os.WriteFile(filepath.Join(oldButNewFile, "new.pt"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// This pod's own run, old: kept (and touched).
	own := f.mk("team-a", "exp1", "node-1")
	age(t, filepath.Join(f.dir, "team-a", "exp1"))

	res, err := Prepare(f.root, opts("team-a", "exp1", 0))
	if err != nil {
		t.Fatal(err)
	}
	for _, keep := range []string{sameName, fresh, oldButNewFile, own} {
		if !exists(filepath.Join(keep, "model.pt")) {
			t.Errorf("%s removed", keep)
		}
	}
	for _, gone := range []string{stale, legacy} {
		if exists(gone) {
			t.Errorf("%s: nothing newer than the retention, kept", gone)
		}
	}
	if len(res.Removed) != 2 {
		t.Errorf("removed %v, want the two stale runs", res.Removed)
	}
	o := opts("team-a", "exp1", 0)
	o.Retain = 0
	age(t, fresh)
	if res, err := Prepare(f.root, o); err != nil || len(res.Removed) != 0 || !exists(fresh) {
		t.Errorf("no retention: removed %v (%v)", res.Removed, err)
	}
}

// A stale run's directory is the trainer's: whatever links it left there
// are removed, never what they point to, inside the root or outside.
func TestPrepare_StaleRunsLinksNotFollowed(t *testing.T) {
	f := newFixture(t)
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "precious"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	fresh := f.mk("team-a", "exp-fresh", "node-0")
	stale := f.mk("team-b", "exp-old", "node-0")
	for name, target := range map[string]string{"out": outside, "in": fresh, "file": filepath.Join(outside, "precious")} {
		if err := os.Symlink(target, filepath.Join(stale, name)); err != nil {
			t.Fatal(err)
		}
	}
	// A whole stale run that is a link (to a fresh one): not a directory
	// of the root's, left alone.
	if err := os.Symlink(filepath.Join(f.dir, "team-a", "exp-fresh"), filepath.Join(f.dir, "team-b", "exp-link")); err != nil {
		t.Fatal(err)
	}
	age(t, filepath.Join(f.dir, "team-b"))
	if _, err := Prepare(f.root, opts("team-a", "exp1", 0)); err != nil {
		t.Fatal(err)
	}
	if exists(stale) {
		t.Error("the stale run was kept")
	}
	if !exists(filepath.Join(outside, "precious")) || !exists(filepath.Join(fresh, "model.pt")) {
		t.Error("a link's target was removed")
	}
}

func TestPrepare_BadInput(t *testing.T) {
	f := newFixture(t)
	for _, o := range []Options{opts("", "exp1", 0), opts("team-a", "", 0), opts("..", "exp1", 0), opts("team-a", "a/b", 0), opts("team-a", "exp1", -1)} {
		if _, err := Prepare(f.root, o); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
	if entries, _ := os.ReadDir(f.dir); len(entries) != 0 {
		t.Errorf("bad input made %v", entries)
	}
}

// TestPrepare_UndeletableStaleRunLeftInPlace: a stale run that cannot be
// removed (an immutable file in it) is said, not an error: the pod's own
// directory is ready and the pod starts (one such directory would
// otherwise fail every pod placed on the node).
func TestPrepare_UndeletableStaleRunLeftInPlace(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("chattr +i needs root (CI runs as root)")
	}
	f := newFixture(t)
	stale := f.mk("team-b", "exp-old", "node-0")
	pinned := filepath.Join(stale, "model.pt")
	age(t, filepath.Join(f.dir, "team-b")) // before: an immutable file's times do not change
	if out, err := exec.Command("chattr", "+i", pinned).CombinedOutput(); err != nil {
		t.Skipf("chattr +i on this file system: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("chattr", "-i", pinned).Run() })
	res, err := Prepare(f.root, opts("team-a", "exp1", 0))
	if err != nil {
		t.Fatalf("an undeletable stale run failed the prepare: %v", err)
	}
	if res.Unremoved == nil || !exists(pinned) {
		t.Errorf("unremoved %v, file there %v: want it said and left", res.Unremoved, exists(pinned))
	}
	if fi, err := os.Stat(filepath.Join(f.dir, res.Dir)); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("the pod's directory is not ready: %v", err)
	}
}

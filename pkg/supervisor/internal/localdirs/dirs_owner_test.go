package localdirs

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/checkpoint"
)

// TestDirs_OtherUsersAreaRefused (security review, item 2): mallory
// pre-created an empty spotagent-<run> area 0777 in a world-writable
// --checkpoint-dir; the agent adopted it and the trainer wrote its
// checkpoint where she could read and change it before the commit. The
// area must be the agent's euid's and 0700, and a --checkpoint-dir others
// can write must be sticky (else they rename the area away).
func TestDirs_OtherUsersAreaRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the directories belong to uid 65534")
	}
	const nobody = 65534
	mkdir := func(p string, mode os.FileMode, uid int) { t.Helper(); testutil.MkdirOwned(t, p, mode, uid) }
	const run = "own"
	open := func(ckpt string, sidecar bool) (*observer.ObservedLogs, error) {
		core, logs := observer.New(zap.InfoLevel)
		d, err := Open(nil, ckpt, run, sidecar, zap.New(core))
		if err == nil {
			d.Close()
		}
		return logs, err
	}
	area := func(ckpt string) string { return filepath.Join(ckpt, AreaPrefix+run) }

	t.Run("area made by another user", func(t *testing.T) {
		ckpt := filepath.Join(testutil.ShortDir(t), "ckpt")
		mkdir(ckpt, os.ModeSticky|0o777, 0)
		mkdir(area(ckpt), 0o777, nobody)
		_, err := open(ckpt, false)
		if !errors.Is(err, checkpoint.ErrRefused) || !strings.Contains(err.Error(), "owned by uid 65534") || !strings.Contains(err.Error(), area(ckpt)) {
			t.Fatalf("open: %v, want a refusal naming the area and its owner", err)
		}
		if _, err := os.Lstat(filepath.Join(area(ckpt), AreaMarker)); !os.IsNotExist(err) {
			t.Fatalf("the marker was written into the other user's area: %v", err)
		}
	})
	t.Run("own area open to others loses read and write", func(t *testing.T) {
		ckpt := filepath.Join(testutil.ShortDir(t), "ckpt")
		mkdir(ckpt, os.ModeSticky|0o777, 0)
		mkdir(area(ckpt), 0o777, os.Geteuid())
		logs, err := open(ckpt, false)
		if err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(area(ckpt))
		// The search bit stays: it lets a trainer of another uid reach
		// the directory it was handed (LetThrough), and lists nothing.
		if err != nil || fi.Mode().Perm() != 0o711 {
			t.Fatalf("area mode %v (%v), want 0711", fi.Mode(), err)
		}
		if logs.FilterMessageSnippet("read and write taken away").Len() != 1 {
			t.Fatalf("the chmod was not logged: %v", logs.All())
		}
	})
	t.Run("writable checkpoint dir without sticky bit", func(t *testing.T) {
		ckpt := filepath.Join(testutil.ShortDir(t), "ckpt")
		mkdir(ckpt, 0o777, 0)
		_, err := open(ckpt, false)
		if !errors.Is(err, checkpoint.ErrRefused) || !strings.Contains(err.Error(), "sticky") || !strings.Contains(err.Error(), ckpt) {
			t.Fatalf("open: %v, want a refusal naming the directory and the sticky bit", err)
		}
		if _, err := os.Lstat(area(ckpt)); !os.IsNotExist(err) {
			t.Fatalf("the area was made: %v", err)
		}
		// Sidecar: the pod is the boundary and an emptyDir is 0777: a warning.
		logs, err := open(ckpt, true)
		if err != nil {
			t.Fatalf("sidecar: %v", err)
		}
		if logs.FilterMessageSnippet("without the sticky bit").Len() != 1 {
			t.Fatalf("no warning: %v", logs.All())
		}
	})
	t.Run("node run dir made by another user", func(t *testing.T) {
		// <checkpoint-root>/<run-id>, made by a pod's user before the
		// node agent's first run of that id: it could swap the area.
		runDir := filepath.Join(testutil.ShortDir(t), run)
		mkdir(runDir, 0o755, nobody)
		r, err := os.OpenRoot(runDir)
		if err != nil {
			t.Fatal(err)
		}
		d, err := Open(r, runDir, run, true, zap.NewNop()) // no command: a sidecar
		if err == nil {
			d.Close()
		}
		if !errors.Is(err, checkpoint.ErrRefused) || !strings.Contains(err.Error(), "owned by uid 65534") {
			t.Fatalf("open: %v, want a refusal naming the owner", err)
		}
	})
	t.Run("checkpoint dir of another user", func(t *testing.T) {
		ckpt := filepath.Join(testutil.ShortDir(t), "ckpt")
		mkdir(ckpt, 0o755, nobody)
		if _, err := open(ckpt, true); !errors.Is(err, checkpoint.ErrRefused) || !strings.Contains(err.Error(), "owned by uid 65534") {
			t.Fatalf("open: %v, want a refusal naming the owner", err)
		}
	})
}

// TestDirs_AncestorsOfOtherUsersRefused (hostile-user trial, HIGH):
// nobody ran `mkdir /tmp/hx-evil`, root ran a trainer with
// --checkpoint-dir /tmp/hx-evil/ckpt, and once it started nobody renamed
// ckpt away and put a tree of theirs in its place: the trainer wrote its
// weights there and, after a restart, loaded a restore planted there.
// Every directory on the way to --checkpoint-dir must be root's or the
// agent's, and not writable by others unless sticky (like /tmp); a sidecar
// (the pod is the boundary: an emptyDir is 0777) only warns about the
// latter. Nothing is made in the checkpoint dir of a refused one.
func TestDirs_AncestorsOfOtherUsersRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the directories belong to uid 65534")
	}
	const nobody, run = 65534, "own"
	base := testutil.ShortDir(t) // in /tmp: root's, 0700
	if err := os.Chmod(base, os.ModeSticky|0o777); err != nil {
		t.Fatal(err)
	}
	mkdir := func(p string, mode os.FileMode, uid int) string {
		t.Helper()
		return testutil.MkdirOwned(t, p, mode, uid)
	}
	open := func(ckpt string, sidecar bool) (*observer.ObservedLogs, error) {
		core, logs := observer.New(zap.InfoLevel)
		d, err := Open(nil, ckpt, run, sidecar, zap.New(core))
		if err == nil {
			d.Close()
		}
		return logs, err
	}
	noArea := func(ckpt string) {
		t.Helper()
		if _, err := os.Lstat(filepath.Join(ckpt, AreaPrefix+run)); !os.IsNotExist(err) {
			t.Fatalf("the area was made in %s: %v", ckpt, err)
		}
	}

	t.Run("parent of another user", func(t *testing.T) {
		evil := mkdir(filepath.Join(base, "hx-evil"), 0o755, nobody)
		ckpt := filepath.Join(evil, "ckpt")
		for _, sidecar := range []bool{false, true} {
			_, err := open(ckpt, sidecar)
			if !errors.Is(err, checkpoint.ErrRefused) || !strings.Contains(err.Error(), evil+" is owned by uid 65534") ||
				!strings.Contains(err.Error(), ckpt) || !strings.Contains(err.Error(), "pick a directory elsewhere") {
				t.Fatalf("open (sidecar %v): %v, want a refusal naming the directory, the parent, its owner and the fix", sidecar, err)
			}
			noArea(ckpt)
		}
	})
	t.Run("nothing made below another user's directory", func(t *testing.T) {
		// evil/a is nobody's symlink to a directory of root's: had the
		// missing levels been made before the check, b/ckpt would have
		// been made there, where nobody chose, and only then refused.
		evil := mkdir(filepath.Join(base, "hx-evil2"), 0o755, nobody)
		victim := mkdir(filepath.Join(base, "victim"), 0o700, 0)
		if err := os.Symlink(victim, filepath.Join(evil, "a")); err != nil {
			t.Fatal(err)
		}
		ckpt := filepath.Join(evil, "a", "b", "ckpt")
		if _, err := open(ckpt, false); !errors.Is(err, checkpoint.ErrRefused) || !strings.Contains(err.Error(), evil+" is owned by uid 65534") {
			t.Fatalf("open: %v, want a refusal naming %s", err, evil)
		}
		if _, err := os.Lstat(filepath.Join(victim, "b")); !os.IsNotExist(err) {
			t.Fatalf("a level was made in %s before the refusal: %v", victim, err)
		}
	})
	t.Run("grandparent writable without the sticky bit", func(t *testing.T) {
		shared := mkdir(filepath.Join(base, "shared"), 0o777, 0)
		ckpt := filepath.Join(mkdir(filepath.Join(shared, "team"), 0o755, 0), "ckpt")
		_, err := open(ckpt, false)
		if !errors.Is(err, checkpoint.ErrRefused) || !strings.Contains(err.Error(), shared+" is writable by group or others without the sticky bit") ||
			!strings.Contains(err.Error(), "chmod +t "+shared) {
			t.Fatalf("open: %v, want a refusal naming the directory, its mode and the fix", err)
		}
		noArea(ckpt)
		logs, err := open(ckpt, true)
		if err != nil {
			t.Fatalf("sidecar: %v", err)
		}
		if w := logs.FilterMessageSnippet("above the checkpoint dir is writable").All(); len(w) != 1 || w[0].ContextMap()["above"] != shared {
			t.Fatalf("sidecar: %v, want one warning naming %s", logs.All(), shared)
		}
	})
	t.Run("symlink of another user on the way", func(t *testing.T) {
		mine := mkdir(filepath.Join(base, "mine"), 0o700, 0)
		link := filepath.Join(base, "her-link")
		if err := os.Symlink(mine, link); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(link, nobody, nobody); err != nil {
			t.Fatal(err)
		}
		if _, err := open(filepath.Join(link, "ckpt"), true); !errors.Is(err, checkpoint.ErrRefused) || !strings.Contains(err.Error(), link+" is a symlink owned by uid 65534") {
			t.Fatalf("open: %v, want a refusal naming the symlink", err)
		}
		noArea(filepath.Join(mine, "ckpt"))
	})
	t.Run("root's sticky directory like /tmp", func(t *testing.T) {
		mine := mkdir(filepath.Join(base, "root-link-target"), 0o755, 0)
		link := filepath.Join(base, "root-link")
		if err := os.Symlink(mine, link); err != nil {
			t.Fatal(err)
		}
		for _, ckpt := range []string{filepath.Join(base, "ckpt"), filepath.Join(link, "ckpt")} {
			logs, err := open(ckpt, false)
			if err != nil || logs.Len() != 0 {
				t.Fatalf("open %s: %v %v, want it opened without a word", ckpt, err, logs.All())
			}
		}
	})
}

// TestHandTo: a request's directory is given to the trainer's uid through
// the area's handle, 0700; a symlink planted in its place is refused and
// its target left alone. LetThrough adds only the search bit, and only to
// a directory of the agent's euid.
func TestHandTo(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: gives a directory to uid 65534")
	}
	dir := testutil.ShortDir(t)
	r, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := os.Mkdir(filepath.Join(dir, "req"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := HandTo(r, "req", 65534); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, "req"))
	if err != nil || ownerUID(fi) != 65534 || fi.Mode().Perm() != 0o700 {
		t.Fatalf("handed directory: %v owner %d (%v), want 0700 owned by 65534", fi.Mode(), ownerUID(fi), err)
	}
	target := filepath.Join(dir, "target")
	if err := os.Mkdir(target, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("target", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	if err := HandTo(r, "link", 65534); err == nil {
		t.Fatal("HandTo followed a symlink")
	}
	if fi, _ := os.Stat(target); ownerUID(fi) != 0 {
		t.Fatalf("the symlink's target was given away: owner %d", ownerUID(fi))
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := LetThrough(r); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(dir); fi.Mode().Perm() != 0o711 {
		t.Fatalf("after LetThrough: %v, want 0711", fi.Mode())
	}
	other, err := os.OpenRoot(filepath.Join(dir, "req")) // 65534's
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := LetThrough(other); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(filepath.Join(dir, "req")); fi.Mode().Perm() != 0o700 {
		t.Fatalf("LetThrough changed another user's directory: %v", fi.Mode())
	}
}

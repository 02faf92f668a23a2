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
	mkdir := func(p string, mode os.FileMode, uid int) {
		t.Helper()
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, uid, uid); err != nil {
			t.Fatal(err)
		}
	}
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

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
	t.Run("own area open to others is made 0700", func(t *testing.T) {
		ckpt := filepath.Join(testutil.ShortDir(t), "ckpt")
		mkdir(ckpt, os.ModeSticky|0o777, 0)
		mkdir(area(ckpt), 0o777, os.Geteuid())
		logs, err := open(ckpt, false)
		if err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(area(ckpt))
		if err != nil || fi.Mode().Perm() != 0o700 {
			t.Fatalf("area mode %v (%v), want 0700", fi.Mode(), err)
		}
		if logs.FilterMessageSnippet("made 0700").Len() != 1 {
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

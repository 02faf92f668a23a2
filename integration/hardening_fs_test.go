package integration

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/cloud/file"
)

// Issue 13, local directories: the agent binary deletes and writes only
// inside its own area of --checkpoint-dir, whatever is there at start and
// whatever the trainer does to it.

// seedCheckpoint commits one checkpoint of step into the file store at
// storeDir, as an earlier run would have.
func seedCheckpoint(t *testing.T, storeDir string, step int64) {
	t.Helper()
	st, err := file.New(storeDir)
	if err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "w"), []byte("weights"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &commit.Committer{Store: st, RunID: "hostile"}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.Commit(ctx, commit.Request{Dir: src, ID: "seed", Step: step, Reason: "periodic"}); err != nil {
		t.Fatal(err)
	}
}

// TestHardening_CheckpointDirIsAProject (item 5): --checkpoint-dir points
// at a project directory that other runs share. A start deletes nothing of
// the project's (src/, data/, a directory that only looks like a
// checkpoint's) nor another run's area, only its own run's leftovers.
func TestHardening_CheckpointDirIsAProject(t *testing.T) {
	parallel(t)
	dir := testutil.ShortDir(t)
	ckpt := filepath.Join(dir, "ckpt")
	write := func(rel, body string) {
		p := filepath.Join(ckpt, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	keep := []string{"src/train.py", "data/shard-0", "0123456789ab/w", "spotagent-other/.spotagent-run", "spotagent-other/abcdefabcdef/w"}
	for _, rel := range keep {
		write(rel, "x")
	}
	write("spotagent-hostile/.spotagent-run", "hostile\n")
	write("spotagent-hostile/abcdefabcdef/w", "left by a crash")
	p := start(t, nil, hostileArgs(dir, "--", "/bin/sh", "-c", "exit 0")...)
	if code := p.wait(time.Minute); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	for _, rel := range keep {
		if _, err := os.Stat(filepath.Join(ckpt, rel)); err != nil {
			t.Errorf("%s deleted at start: %v", rel, err)
		}
	}
	if _, err := os.Stat(filepath.Join(ckpt, "spotagent-hostile", "abcdefabcdef")); !os.IsNotExist(err) {
		t.Errorf("the run's own leftover request directory is still there: %v", err)
	}
}

// TestHardening_RestoreDirSwappedForSymlink (item 3a): the trainer
// replaces the directory holding its restored checkpoint with a symlink to
// a directory of its choosing and fails; the restart's restore refuses the
// symlink, logs why, the run ends with the trainer's exit code, and the
// target keeps its files.
func TestHardening_RestoreDirSwappedForSymlink(t *testing.T) {
	parallel(t)
	dir := testutil.ShortDir(t)
	seedCheckpoint(t, filepath.Join(dir, "store"), 7)
	victim := filepath.Join(dir, "victim")
	if err := os.MkdirAll(victim, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(victim, "precious"), []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	script := `test -n "$SPOTAGENT_RESUME_DIR" || exit 9; r=$(dirname "$SPOTAGENT_RESUME_DIR"); ` +
		`test -L "$r" || { mv "$r" "$r.moved" && ln -s ` + victim + ` "$r"; }; exit 3`
	// --restore-serial: this trainer reads $SPOTAGENT_RESUME_DIR itself.
	p := start(t, nil, hostileArgs(dir, "--max-restarts", "1", "--restore-serial", "--", "/bin/sh", "-c", script)...)
	if code := p.wait(time.Minute); code != 3 {
		t.Fatalf("exit code %d, want the trainer's 3", code)
	}
	p.waitEntry("restore for restart failed", time.Second, nil)
	ents, err := os.ReadDir(victim)
	if err != nil || len(ents) != 1 {
		t.Fatalf("symlink target changed: %v %v", ents, err)
	}
	if b, err := os.ReadFile(filepath.Join(victim, "precious")); err != nil || string(b) != "keep" {
		t.Fatalf("precious = %q %v", b, err)
	}
}

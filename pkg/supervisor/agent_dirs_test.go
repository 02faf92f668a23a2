package supervisor

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/sigbridge"
	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/internal/testutil/trainertest"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/checkpoint/restore"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/file"
	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/schedule"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// Issue 13: the agent reads, writes and deletes only inside its own
// directories, whatever a trainer does to them.

// TestAgent_CleanupOnlyItsOwn (item 5): at start the agent deletes the
// request directories an earlier session of its run left in its area, and
// nothing else: not a project's src/ and data/, not a directory that only
// looks like a request's, not another run's area.
func TestAgent_CleanupOnlyItsOwn(t *testing.T) {
	dir := testutil.ShortDir(t)
	ckpt := filepath.Join(dir, "ckpt")
	keep := []string{"src/main.py", "data/train.bin", "0123456789ab/w", "spotagent-other/abcdefabcdef/w", "spotagent-other/.spotagent-run", "spotagent-test/mine/w"}
	for _, p := range keep {
		testutil.WriteFile(t, filepath.Join(ckpt, p), "x")
	}
	testutil.WriteFile(t, filepath.Join(ckpt, "spotagent-test", ".spotagent-run"), "test\n")
	testutil.WriteFile(t, filepath.Join(ckpt, "spotagent-test", "abcdefabcdef", "w"), "left by a crash")
	ar := startAgent(t, func(c *Config) {
		c.CheckpointDir = ckpt
		c.Command = []string{"/bin/sh", "-c", "exit 0"}
	})
	if code := ar.wait(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	for _, p := range keep {
		if _, err := os.Stat(filepath.Join(ckpt, p)); err != nil {
			t.Errorf("%s deleted at start: %v", p, err)
		}
	}
	if _, err := os.Stat(filepath.Join(ckpt, "spotagent-test", "abcdefabcdef")); !os.IsNotExist(err) {
		t.Errorf("the run's leftover request directory is still there: %v", err)
	}
}

// TestAgent_AreaWithoutMarkerRefused (item 5): a non-empty directory
// where the agent's area goes, without the marker, is not adopted.
func TestAgent_AreaWithoutMarkerRefused(t *testing.T) {
	dir := testutil.ShortDir(t)
	ckpt := filepath.Join(dir, "ckpt")
	testutil.WriteFile(t, filepath.Join(ckpt, "spotagent-test", "abcdefabcdef", "w"), "someone's")
	st, err := file.New(filepath.Join(dir, "store"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = newAgent(context.Background(), Config{RunID: "test", CheckpointDir: ckpt, Store: st}, nil)
	if err == nil || !strings.Contains(err.Error(), "marker") {
		t.Fatalf("newAgent: %v, want a refusal naming the marker", err)
	}
	if got := testutil.ReadFile(t, filepath.Join(ckpt, "spotagent-test", "abcdefabcdef", "w")); got != "someone's" {
		t.Fatalf("file changed: %q", got)
	}
}

// TestAgent_RestoreAreaSwappedForSymlink (item 3a): the trainer replaces
// the restore directory with a symlink to a directory of its choosing and
// fails; the restart's restore refuses the symlink (logged as such; the
// run ends with the trainer's code) and the target keeps its files.
func TestAgent_RestoreAreaSwappedForSymlink(t *testing.T) {
	first := startAgent(t, nil)
	tr := trainertest.Dial(t, first.cfg.Server.Path)
	tr.Hello()
	tr.Send(map[string]any{"type": "done", "step": 5, "dir": mkCheckpoint(t, first.cfg.CheckpointDir, "first")})
	tr.Expect(protocol.TypeCommitted)
	first.sigs <- syscall.SIGTERM
	tr.Expect(protocol.TypeCheckpoint) // not answered: the shutdown checkpoint fails
	first.sigs <- syscall.SIGTERM
	first.wait(t)

	victim := filepath.Join(testutil.ShortDir(t), "victim")
	testutil.WriteFile(t, filepath.Join(victim, "precious"), "keep")
	script := `test -n "$SPOTAGENT_RESUME_DIR" || exit 9; r=$(dirname "$SPOTAGENT_RESUME_DIR"); ` +
		`mv "$r" "$r.moved" && ln -s ` + victim + ` "$r"; exit 3`
	core, logs := observer.New(zap.InfoLevel)
	ar := startAgent(t, func(c *Config) {
		c.Store = first.store
		c.MaxRestarts = 1
		c.Command = []string{"/bin/sh", "-c", script}
		c.Log = zap.New(core)
	})
	if code := ar.wait(t); code != 3 {
		t.Fatalf("exit code %d, want the trainer's 3 (restart refused)", code)
	}
	failed := logs.FilterMessage("restore for restart failed").All()
	if len(failed) != 1 || !strings.Contains(fmt.Sprint(failed[0].ContextMap()["error"]), "symlink") {
		t.Fatalf("want one 'restore for restart failed' naming the symlink, got %v", failed)
	}
	ents, err := os.ReadDir(victim)
	if err != nil || len(ents) != 1 || testutil.ReadFile(t, filepath.Join(victim, "precious")) != "keep" {
		t.Fatalf("symlink target changed: %v %v", ents, err)
	}
}

// TestAgent_UnsolicitedDirSwapped (items 3b, 3c): after a done for
// sub/mine, the trainer renames sub and puts a symlink to a directory of
// its choosing in its place. The commit uploads the original files, and
// the removal after it deletes nothing outside the checkpoint directory.
func TestAgent_UnsolicitedDirSwapped(t *testing.T) {
	gate := commit.NewGate(1)
	_, hold, err := gate.Acquire(context.Background(), commit.Claim{})
	if err != nil {
		t.Fatal(err)
	}
	ar := startAgent(t, func(c *Config) { c.UploadGate = gate })
	tr := trainertest.Dial(t, ar.cfg.Server.Path)
	tr.Hello()
	sub := filepath.Join(ar.cfg.CheckpointDir, "sub")
	testutil.WriteFile(t, filepath.Join(sub, "mine", "w"), "mine")
	victim := filepath.Join(testutil.ShortDir(t), "victim")
	testutil.WriteFile(t, filepath.Join(victim, "mine", "w"), "evil")
	tr.Send(map[string]any{"type": "done", "step": 3, "dir": filepath.Join(sub, "mine")})
	testutil.WaitFor(t, "the commit scanned and waiting for its upload slot", func() bool { return gate.Waiting() == 1 })
	if err := os.Rename(sub, sub+".moved"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, sub); err != nil {
		t.Fatal(err)
	}
	hold()
	c := tr.Expect(protocol.TypeCommitted)
	r, err := restore.Checkpoint(context.Background(), ar.store, testutil.ShortDir(t), restore.Options{})
	if err != nil || r.Manifest.ID != c.ID {
		t.Fatalf("restore: %v", err)
	}
	if got := testutil.ReadFile(t, filepath.Join(r.Dir, "w")); got != "mine" {
		t.Fatalf("committed %q, want the original %q", got, "mine")
	}
	ar.sigs <- syscall.SIGTERM
	tr.Expect(protocol.TypeCheckpoint)
	ar.sigs <- syscall.SIGTERM
	ar.wait(t)
	if got := testutil.ReadFile(t, filepath.Join(victim, "mine", "w")); got != "evil" {
		t.Fatalf("symlink target changed: %q", got)
	}
}

// TestAgent_ManifestCopyNoFollow (item 3d): a symlink planted where the
// local manifest copy goes is replaced, not written through.
func TestAgent_ManifestCopyNoFollow(t *testing.T) {
	first := startAgent(t, nil)
	tr := trainertest.Dial(t, first.cfg.Server.Path)
	tr.Hello()
	tr.Send(map[string]any{"type": "done", "step": 5, "dir": mkCheckpoint(t, first.cfg.CheckpointDir, "first")})
	c := tr.Expect(protocol.TypeCommitted)
	first.sigs <- syscall.SIGTERM
	first.sigs <- syscall.SIGTERM
	first.wait(t)

	dir := testutil.ShortDir(t)
	ckpt := filepath.Join(dir, "ckpt")
	victim := filepath.Join(dir, "victim")
	testutil.WriteFile(t, victim, "keep")
	name := "000000000005-" + c.ID + ".manifest.json"
	testutil.WriteFile(t, filepath.Join(ckpt, "spotagent-test", ".spotagent-run"), "test\n")
	for _, d := range []string{filepath.Join(ckpt, "restore"), filepath.Join(ckpt, "spotagent-test", "restore")} {
		os.MkdirAll(d, 0o700)
		if err := os.Symlink(victim, filepath.Join(d, name)); err != nil {
			t.Fatal(err)
		}
	}
	ar := startAgent(t, func(c *Config) { c.Store = first.store; c.CheckpointDir = ckpt })
	w := trainertest.Dial(t, ar.cfg.Server.Path).Hello()
	if w.Resume == nil || w.Resume.Step != 5 {
		t.Fatalf("resume %+v", w.Resume)
	}
	if got := testutil.ReadFile(t, victim); got != "keep" {
		t.Fatalf("victim overwritten through a symlink: %q", got)
	}
	if m, err := os.Lstat(w.Resume.Manifest); err != nil || !m.Mode().IsRegular() || !strings.Contains(testutil.ReadFile(t, w.Resume.Manifest), c.ID) {
		t.Fatalf("local manifest copy %s: %v", w.Resume.Manifest, err)
	}
}

// TestAgent_LowerStepKept (item 11): with keep 1, a done with a step lower
// than the newest committed is committed and retention keeps it (and the
// newest, which latest.json names).
func TestAgent_LowerStepKept(t *testing.T) {
	ar := startAgent(t, func(c *Config) { c.Keep = 1 })
	tr := trainertest.Dial(t, ar.cfg.Server.Path)
	tr.Hello()
	tr.Send(map[string]any{"type": "done", "step": 100, "dir": mkCheckpoint(t, ar.cfg.CheckpointDir, "a")})
	high := tr.Expect(protocol.TypeCommitted)
	tr.Send(map[string]any{"type": "done", "step": 50, "dir": mkCheckpoint(t, ar.cfg.CheckpointDir, "b")})
	low := tr.Expect(protocol.TypeCommitted)
	for _, k := range []string{checkpoint.ManifestKey(50, low.ID), checkpoint.ManifestKey(100, high.ID)} {
		if _, err := checkpoint.ReadManifest(context.Background(), ar.store, k); err != nil {
			t.Fatalf("%s after retention: %v", k, err)
		}
	}
	if got := latestStep(t, ar); got != 100 {
		t.Fatalf("latest step %d, want 100", got)
	}
}

// TestAgent_UnsolicitedDirNames (item 13): directories are compared by
// path element: "restore_mine" is the trainer's; the agent's area is not.
func TestAgent_UnsolicitedDirNames(t *testing.T) {
	ar := startAgent(t, nil)
	tr := trainertest.Dial(t, ar.cfg.Server.Path)
	tr.Hello()
	tr.Send(map[string]any{"type": "done", "step": 1, "dir": mkCheckpoint(t, ar.cfg.CheckpointDir, "restore_mine")})
	tr.Expect(protocol.TypeCommitted)
	tr.Send(map[string]any{"type": "done", "step": 2, "dir": mkCheckpoint(t, ar.cfg.CheckpointDir, "spotagent-test/restore/x")})
	if e := tr.Expect(protocol.TypeError); !strings.Contains(e.Error, "own area") {
		t.Fatalf("error %q, want a refusal of the agent's own area", e.Error)
	}
}

// TestAgent_SignalRequestNoFollow (item 3d): symlinks planted where the
// signal fallback writes request.json (and its temp file) are replaced,
// never written through.
func TestAgent_SignalRequestNoFollow(t *testing.T) {
	dir := testutil.ShortDir(t)
	ckpt := filepath.Join(dir, "ckpt")
	victim := filepath.Join(dir, "victim")
	testutil.WriteFile(t, victim, "keep")
	testutil.WriteFile(t, filepath.Join(ckpt, "spotagent-test", ".spotagent-run"), "test\n")
	var reqs []string
	for _, d := range []string{ckpt, filepath.Join(ckpt, "spotagent-test")} {
		reqs = append(reqs, filepath.Join(d, sigbridge.RequestFile))
		for _, n := range []string{sigbridge.RequestFile + ".tmp"} {
			if err := os.Symlink(victim, filepath.Join(d, n)); err != nil {
				t.Fatal(err)
			}
		}
	}
	ar := startAgent(t, func(c *Config) {
		c.CheckpointDir = ckpt
		c.Signal = syscall.SIGUSR1
		c.Command = []string{"/bin/sh", "-c", `trap 'echo signalled' USR1; touch ` + filepath.Join(dir, "ready") + `; while :; do sleep 0.05; done`}
	})
	testutil.WaitFor(t, "the trainer's handler", func() bool { _, err := os.Stat(filepath.Join(dir, "ready")); return err == nil })
	ar.sigs <- syscall.SIGTERM // a shutdown checkpoint: request.json, then SIGUSR1
	testutil.WaitFor(t, "request.json written", func() bool {
		for _, p := range reqs {
			if fi, err := os.Lstat(p); err == nil && fi.Mode().IsRegular() {
				return true
			}
		}
		return testutil.ReadFile(t, victim) != "keep"
	})
	if got := testutil.ReadFile(t, victim); got != "keep" {
		t.Fatalf("victim overwritten through a symlink: %q", got)
	}
	ar.sigs <- syscall.SIGTERM
	ar.wait(t)
}

// TestAgent_SymlinkEscape: the trainer plants a symlink to /etc/passwd,
// then one to .., in a requested checkpoint's directory. Each commit is
// refused (`checkpoint not committed`, naming the file; `upload_failed` to
// the trainer), nothing of either reaches the store, and the next honest
// checkpoint commits, the stop's too. A done naming a directory outside
// the checkpoint directory, or one through a symlink inside it, from a
// connection that never said hello, is refused (`error` reply, logged
// `unsolicited done refused`) and nothing of it is committed. (The
// end-to-end TestHostile_SymlinkEscape was cut in #49.)
func TestAgent_SymlinkEscape(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	ar := startAgent(t, func(c *Config) {
		c.Scheduler = schedule.NewScheduler(schedule.SchedulerConfig{Fixed: 50 * time.Millisecond})
		c.Log = zap.New(core)
	})
	tr := trainertest.Dial(t, ar.cfg.Server.Path)
	tr.Hello()
	tr.Save(tr.Expect(protocol.TypeCheckpoint), 1, "first")
	tr.Expect(protocol.TypeCommitted)
	var refused []string
	for i, c := range []struct{ name, target string }{{"passwd", "/etc/passwd"}, {"up", ".."}} {
		req := tr.Expect(protocol.TypeCheckpoint)
		testutil.WriteFile(t, filepath.Join(req.Dir, "state.bin"), "w")
		if err := os.Symlink(c.target, filepath.Join(req.Dir, c.name)); err != nil {
			t.Fatal(err)
		}
		tr.Send(map[string]any{"type": "done", "id": req.ID, "step": 2 + i})
		if f := tr.Expect(protocol.TypeUploadFailed); f.ID != req.ID || !strings.Contains(f.Error, "refused") {
			t.Fatalf("upload_failed %+v, want id %s, refused", f, req.ID)
		}
		testutil.WaitFor(t, "the refusal logged", func() bool {
			return logs.FilterMessage("checkpoint not committed").FilterField(zap.String("id", req.ID)).Len() == 1
		})
		e := logs.FilterMessage("checkpoint not committed").FilterField(zap.String("id", req.ID)).All()[0]
		if msg := fmt.Sprint(e.ContextMap()["error"]); !strings.Contains(msg, c.name) || !strings.Contains(msg, "refused") {
			t.Fatalf("commit of %s failed with %q, want a refusal naming %s", req.ID, msg, c.name)
		}
		refused = append(refused, req.ID)
	}
	// The agent carries on: the next honest checkpoint commits.
	tr.Save(tr.Expect(protocol.TypeCheckpoint), 4, "honest")
	tr.Expect(protocol.TypeCommitted)

	evil := filepath.Join(ar.cfg.CheckpointDir, "evil")
	if err := os.Symlink("/etc", evil); err != nil {
		t.Fatal(err)
	}
	raw := trainertest.Dial(t, ar.cfg.Server.Path) // no hello
	dirs := []string{"/etc", filepath.Join(ar.cfg.CheckpointDir, "..", ".."), evil}
	for _, d := range dirs {
		raw.Send(map[string]any{"type": "done", "step": 99, "dir": d})
		raw.Expect(protocol.TypeError)
		testutil.WaitFor(t, "the refusal of "+d+" logged", func() bool {
			return logs.FilterMessage("unsolicited done refused").FilterField(zap.String("dir", d)).Len() == 1
		})
	}
	if n := logs.FilterMessage("unsolicited done refused").Len(); n != len(dirs) {
		t.Fatalf("%d unsolicited done refused, want %d", n, len(dirs))
	}

	// The stop's checkpoint commits (a periodic one pending becomes it).
	ar.sigs <- syscall.SIGTERM
	for stopped := false; !stopped; {
		select {
		case m := <-tr.Msgs():
			switch m.Type {
			case protocol.TypeCheckpoint:
				tr.Save(m, 5, "last")
			case protocol.TypeStop:
				stopped = true
			}
		case <-time.After(testutil.Wait):
			t.Fatal("no stop")
		}
	}
	if got := latestStep(t, ar); got != 5 {
		t.Fatalf("latest step %d, want the stop's 5", got)
	}
	secret, err := os.ReadFile("/etc/passwd")
	if err != nil || len(secret) == 0 {
		t.Fatalf("/etc/passwd: %v", err)
	}
	var keys []string
	ar.store.List(context.Background(), "", func(o cloud.ObjectInfo) error { keys = append(keys, o.Key); return nil })
	for _, k := range keys {
		for _, id := range refused {
			if strings.Contains(k, id) {
				t.Errorf("object %s of refused checkpoint %s reached the store", k, id)
			}
		}
		r, err := ar.store.Get(context.Background(), k, 0, -1)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(r)
		r.Close()
		if err != nil || bytes.Contains(b, secret) {
			t.Errorf("store object %s holds /etc/passwd (%v)", k, err)
		}
	}
	if n := logs.FilterMessageSnippet("trainer took a checkpoint on its own").Len(); n != 0 {
		t.Fatalf("%d unsolicited checkpoints taken, want none", n)
	}
}

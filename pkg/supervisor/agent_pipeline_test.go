package supervisor

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/internal/testutil/noticetest"
	"github.com/spotagent/spotagent/internal/testutil/trainertest"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/restore"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/schedule"
)

// Issue 16: `saved` starts a file's upload before done; done still decides.

func TestAgent_SavedUploadsBeforeDone(t *testing.T) {
	ar := startAgent(t, nil)
	tr := trainertest.Dial(t, ar.cfg.Server.Path)
	tr.Hello()
	tr.Send(map[string]any{"type": "progress", "step": 42})
	ar.sigs <- syscall.SIGTERM
	req := tr.Expect(protocol.TypeCheckpoint)
	testutil.WriteFile(t, filepath.Join(req.Dir, "model.pt"), "weights")
	tr.Send(map[string]any{"type": "saved", "id": req.ID, "path": "model.pt", "step": 42})
	key := checkpoint.Prefix(42, req.ID) + "model.pt"
	testutil.WaitFor(t, "model.pt uploaded before done", func() bool {
		_, err := ar.store.Stat(context.Background(), key)
		return err == nil
	})
	if _, err := checkpoint.ReadLatest(context.Background(), ar.store); !errors.Is(err, cloud.ErrNotExist) {
		t.Fatalf("latest.json before done: %v", err)
	}
	testutil.WriteFile(t, filepath.Join(req.Dir, "sub", "optim.pt"), "moments")
	tr.Send(map[string]any{"type": "saved", "id": req.ID, "path": filepath.Join(req.Dir, "sub", "optim.pt")})
	tr.Send(map[string]any{"type": "done", "id": req.ID, "step": 42, "blocked_ms": 1})
	tr.Expect(protocol.TypeCommitted)
	tr.Expect(protocol.TypeStop)
	// δ is the time training was blocked, not request → done.
	if got, want := ar.cfg.Scheduler.Cost(), time.Millisecond; got != want {
		t.Fatalf("scheduler cost=%v, want %v (the trainer's blocked_ms)", got, want)
	}
	r, err := restore.Checkpoint(context.Background(), ar.store, t.TempDir(), restore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := testutil.ReadFile(t, filepath.Join(r.Dir, "model.pt")) + "/" + testutil.ReadFile(t, filepath.Join(r.Dir, "sub", "optim.pt")); got != "weights/moments" {
		t.Fatalf("restored %q", got)
	}
}

// A `saved` the agent cannot use gets an error carrying the request's id,
// uploads nothing, and the checkpoint still commits what done finds.
func TestAgent_SavedRefused(t *testing.T) {
	ar := startAgent(t, nil)
	tr := trainertest.Dial(t, ar.cfg.Server.Path)
	tr.Hello()
	testutil.WriteFile(t, filepath.Join(ar.cfg.CheckpointDir, "secret"), "not for the store")
	ar.sigs <- syscall.SIGTERM
	req := tr.Expect(protocol.TypeCheckpoint)
	testutil.WriteFile(t, filepath.Join(req.Dir, "model.pt"), "weights")
	os.Symlink(filepath.Join(ar.cfg.CheckpointDir, "secret"), filepath.Join(req.Dir, "link"))
	tr.Send(map[string]any{"type": "saved", "id": req.ID, "path": "model.pt"})
	for _, tc := range []struct{ id, path, want string }{
		{req.ID, "../secret", "not a path inside"},
		{req.ID, filepath.Join(ar.cfg.CheckpointDir, "secret"), "not inside the checkpoint directory"},
		{req.ID, "/etc/passwd", "not inside the checkpoint directory"},
		{req.ID, "model.pt", "already reported saved"},
		{req.ID, "missing.pt", "no such file"},
		{req.ID, "link", "saved"},
		{req.ID, "", "path is required"},
		{"nope", "model.pt", "unknown checkpoint id"},
		{"", "model.pt", "unknown checkpoint id"},
	} {
		tr.Send(map[string]any{"type": "saved", "id": tc.id, "path": tc.path})
		e := tr.Expect(protocol.TypeError)
		if e.ID != tc.id || !strings.Contains(e.Error, tc.want) {
			t.Errorf("saved %q: error %+v, want id %q and %q", tc.path, e, tc.id, tc.want)
		}
	}
	os.Remove(filepath.Join(req.Dir, "link"))
	testutil.WriteFile(t, filepath.Join(req.Dir, "missing.pt"), "late") // handled at done like any file
	tr.Send(map[string]any{"type": "done", "id": req.ID, "step": 5})
	tr.Expect(protocol.TypeCommitted)
	r, err := restore.Checkpoint(context.Background(), ar.store, t.TempDir(), restore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, f := range r.Manifest.Files {
		paths = append(paths, f.Path)
	}
	if got, want := strings.Join(paths, ","), "missing.pt,model.pt"; got != want {
		t.Fatalf("manifest files %s, want %s", got, want)
	}
	ar.store.List(context.Background(), "", func(o cloud.ObjectInfo) error {
		if strings.Contains(o.Key, "secret") || strings.Contains(o.Key, "passwd") || strings.Contains(o.Key, "link") {
			t.Errorf("object %s uploaded from a refused saved", o.Key)
		}
		return nil
	})
}

// A request that ends without done (the trainer failed) leaves none of
// its early uploads in the store.
func TestAgent_SavedThenFailed(t *testing.T) {
	ar := startAgent(t, nil)
	tr := trainertest.Dial(t, ar.cfg.Server.Path)
	tr.Hello()
	ar.sigs <- syscall.SIGTERM
	req := tr.Expect(protocol.TypeCheckpoint)
	testutil.WriteFile(t, filepath.Join(req.Dir, "model.pt"), "weights")
	tr.Send(map[string]any{"type": "saved", "id": req.ID, "path": "model.pt", "step": 3})
	key := checkpoint.Prefix(3, req.ID) + "model.pt"
	testutil.WaitFor(t, "the early upload", func() bool {
		_, err := ar.store.Stat(context.Background(), key)
		return err == nil
	})
	tr.Send(map[string]any{"type": "failed", "id": req.ID, "error": "disk full"})
	tr.Expect(protocol.TypeStop)
	testutil.WaitFor(t, "the early upload deleted", func() bool {
		_, err := ar.store.Stat(context.Background(), key)
		return errors.Is(err, cloud.ErrNotExist)
	})
}

// TestAgent_InterruptionsFirstSavedCancelsPeriodic: a periodic checkpoint's
// upload is held in the store when a notice comes. The interruption's
// request goes out at once, and its first file reported `saved` (its first
// early upload) cancels the periodic upload, before its done: the periodic
// checkpoint never commits; the interruption's does and is the newest.
// (The agent simulation's notice sessions hold this too: its planted bug
// was caught at seed 1156.)
func TestAgent_InterruptionsFirstSavedCancelsPeriodic(t *testing.T) {
	src := noticetest.New(1)
	core, logs := observer.New(zap.InfoLevel)
	var hs *heldStore
	ar := startAgent(t, func(c *Config) {
		hs = &heldStore{Store: c.Store, puts: true}
		c.Store, c.Source, c.Log = hs, src, zap.New(core)
		c.Scheduler = schedule.NewScheduler(schedule.SchedulerConfig{Fixed: 50 * time.Millisecond})
	})
	hs.arm()
	tr := trainertest.Dial(t, ar.cfg.Server.Path)
	tr.Hello()
	per := tr.Expect(protocol.TypeCheckpoint)
	testutil.WriteFile(t, filepath.Join(per.Dir, "w.pt"), "periodic")
	tr.Send(map[string]any{"type": "done", "id": per.ID, "step": 5})
	testutil.WaitFor(t, "the periodic upload held in the store", func() bool { return hs.held() == 1 })

	now := time.Now()
	src.C <- metadata.Notice{Cloud: metadata.CloudAWS, Kind: metadata.KindTermination, ID: "n1", Detected: now, Deadline: now.Add(time.Minute)}
	in, ok := tr.Next(protocol.TypeCheckpoint, testutil.Wait)
	if !ok || in.Reason != protocol.ReasonInterruption {
		t.Fatalf("request after the notice: %+v (ok %v), want the interruption's", in, ok)
	}
	cancelled := func() bool {
		for _, e := range logs.FilterMessage("cancelling periodic upload: interruption checkpoint takes priority").All() {
			if e.ContextMap()["id"] == per.ID {
				return true
			}
		}
		return false
	}
	if cancelled() {
		t.Fatal("the periodic upload was cancelled before the interruption's upload began")
	}
	testutil.WriteFile(t, filepath.Join(in.Dir, "model.pt"), "interruption")
	tr.Send(map[string]any{"type": "saved", "id": in.ID, "path": "model.pt", "step": 6})
	testutil.WaitFor(t, "the periodic upload cancelled at the interruption's first early upload", cancelled)

	tr.Send(map[string]any{"type": "done", "id": in.ID, "step": 6})
	for {
		c, ok := tr.Next(protocol.TypeCommitted, testutil.Wait)
		if !ok {
			t.Fatal("the interruption checkpoint never committed")
		}
		if c.ID == per.ID {
			t.Fatal("the cancelled periodic checkpoint committed")
		}
		if c.ID == in.ID {
			break
		}
	}
	if l, err := checkpoint.ReadLatest(context.Background(), ar.store); err != nil || l.ID != in.ID || l.Step != 6 {
		t.Fatalf("latest=%+v err=%v, want the interruption's %s at step 6", l, err, in.ID)
	}
	if _, err := checkpoint.ReadManifest(context.Background(), ar.store, checkpoint.ManifestKey(5, per.ID)); !errors.Is(err, cloud.ErrNotExist) {
		t.Fatalf("the periodic checkpoint's manifest: %v, want none", err)
	}
	// Cancelled on purpose, not failed: said at info, never as an error
	// (TestStoreFault_AgentThroughFaults, end to end then, failed on the
	// error line once the cancel was timed right).
	testutil.WaitFor(t, "the cancelled periodic checkpoint said", func() bool {
		return logs.FilterMessage("periodic checkpoint not committed: the interruption checkpoint took priority").FilterField(zap.String("id", per.ID)).Len() == 1
	})
	if n := logs.FilterMessage("checkpoint not committed").Len(); n != 0 {
		t.Fatalf("%d 'checkpoint not committed' errors, want none: the periodic one was cancelled on purpose", n)
	}
}

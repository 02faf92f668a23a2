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

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/internal/testutil/trainertest"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/restore"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/protocol"
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

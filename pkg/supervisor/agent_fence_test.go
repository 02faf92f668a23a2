package supervisor

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil/trainertest"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/protocol"
)

// A newer session's lease fences a running agent: its lease check sends
// the trainer a last checkpoint request (reason fenced), the checkpoint is
// uploaded with its epoch but latest.json stays where the newer session
// sealed it, the trainer gets upload_failed and stop (fenced), and the
// agent exits exitFenced.
func TestAgent_Fenced(t *testing.T) {
	ar := startAgent(t, func(c *Config) { c.FenceInterval = 20 * time.Millisecond })
	tr := trainertest.Dial(t, ar.cfg.Server.Path)
	tr.Hello()
	ctx := context.Background()
	newer, err := checkpoint.AcquireLease(ctx, ar.store, checkpoint.LeaseRecord{Session: "newer"})
	if err != nil {
		t.Fatal(err)
	}
	req := tr.Expect(protocol.TypeCheckpoint)
	if req.Reason != reasonFenced || req.Deadline == nil {
		t.Fatalf("checkpoint request=%+v, want reason fenced", req)
	}
	tr.Save(req, 7, "weights")
	if f := tr.Expect(protocol.TypeUploadFailed); f.ID != req.ID {
		t.Fatalf("upload_failed=%+v", f)
	}
	if s := tr.Expect(protocol.TypeStop); s.Reason != reasonFenced {
		t.Fatalf("stop=%+v, want reason fenced", s)
	}
	m, err := checkpoint.ReadManifest(ctx, ar.store, checkpoint.ManifestKey(7, req.ID))
	if err != nil || m.Epoch != newer.Epoch-1 {
		t.Fatalf("last checkpoint manifest=%+v err=%v, want epoch %d", m, err, newer.Epoch-1)
	}
	if _, err := checkpoint.ReadLatest(ctx, ar.store); err == nil {
		t.Fatal("latest.json names a checkpoint: the fenced agent published")
	}
	ar.sigs <- syscall.SIGTERM
	if code := ar.wait(t); code != exitFenced {
		t.Fatalf("exit code %d, want %d", code, exitFenced)
	}
}

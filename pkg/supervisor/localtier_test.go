package supervisor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/protocol"
)

// TestAgent_LocalTier (#38): a committed checkpoint is kept in the area's
// local tier; the next start on the same checkpoint directory restores it
// from there (the journal says local, no byte from the store), and with
// --local-keep 0 the copies are deleted.
func TestAgent_LocalTier(t *testing.T) {
	first := startAgent(t, func(c *Config) { c.LocalKeep = 1 })
	tr := dialTrainer(t, first.cfg.Server.Path)
	tr.hello()
	tr.send(map[string]any{"type": "done", "step": 5, "dir": mkCheckpoint(t, first.cfg.CheckpointDir, "first")})
	c := tr.expect(protocol.TypeCommitted)
	tier := filepath.Join(first.cfg.CheckpointDir, "spotagent-test", tierSub)
	if b, err := os.ReadFile(filepath.Join(tier, "000000000005-"+c.ID, "w")); err != nil || string(b) != "first" {
		t.Fatalf("kept copy: %q, %v", b, err)
	}
	first.sigs <- syscall.SIGTERM
	tr.expect(protocol.TypeCheckpoint) // not answered: the shutdown checkpoint fails
	first.sigs <- syscall.SIGTERM
	first.wait(t)

	restart := func(keep int) journal.RestoreEntry {
		t.Helper()
		ar := startAgent(t, func(cfg *Config) {
			cfg.Store, cfg.CheckpointDir, cfg.LocalKeep = first.store, first.cfg.CheckpointDir, keep
			cfg.Command = []string{"/bin/sh", "-c", `test "$(cat "$SPOTAGENT_RESUME_DIR/w")" = first`}
		})
		if code := ar.wait(t); code != 0 {
			t.Fatalf("exit code %d: the trainer did not resume from the checkpoint", code)
		}
		j, err := journal.Read(context.Background(), first.store, "test")
		if err != nil || len(j.Restores) == 0 {
			t.Fatalf("journal: %v, %v", j, err)
		}
		return j.Restores[len(j.Restores)-1]
	}
	if r := restart(1); r.Sources() != checkpoint.FromLocal || r.From[checkpoint.FromLocal] != 5 {
		t.Fatalf("restore from %v, want 5 bytes from local", r.From)
	}
	// Off: the copies go. (The restore directory of the last restore,
	// verified, still spares the download: that is older behaviour.)
	restart(0)
	if _, err := os.Stat(tier); !os.IsNotExist(err) {
		t.Fatalf("the local tier's copies outlive --local-keep 0: %v", err)
	}
}

// TestNode_LocalTierKeepsEachPart (#38): in node mode each node of a job
// keeps its own part of the shutdown checkpoint (hard links: a stop's
// checkpoint is never copied while the trainer waits), in its run's area.
func TestNode_LocalTierKeepsEachPart(t *testing.T) {
	n := startNode(t, nil, func(c *NodeConfig) { c.Run.LocalKeep = 1 })
	pods := []*trainer{n.dialAs(t, "pod:a"), n.dialAs(t, "pod:b")}
	for k, tr := range pods {
		tr.send(map[string]any{"type": "hello", "pid": os.Getpid(), "run_id": "job", "rank": k, "world_size": 2,
			"local_rank": 0, "local_world_size": 1, "node_rank": k, "nodes": 2})
		tr.expect(protocol.TypeWelcome)
	}
	n.sigs <- syscall.SIGTERM
	var id string
	for k, tr := range pods {
		req := tr.expect(protocol.TypeCheckpoint)
		if k == 1 && req.ID != id {
			tr.send(map[string]any{"type": "join", "id": id, "reason": req.Reason, "deadline": req.Deadline})
			req = tr.expect(protocol.TypeCheckpoint)
		}
		id = req.ID
		mustWrite(t, filepath.Join(req.Dir, fmt.Sprintf("rank-%d.pt", k)), fmt.Sprint(k))
		tr.send(map[string]any{"type": "done", "id": req.ID, "step": 40})
	}
	for _, tr := range pods {
		tr.expect(protocol.TypeCommitted)
	}
	for k := range pods {
		part := fmt.Sprintf("node-%d", k)
		kept := filepath.Join(filepath.Dir(n.sock), "ckpt", "job", part, "spotagent-job", tierSub, "000000000040-"+id)
		ents, err := os.ReadDir(kept)
		if err != nil || len(ents) != 1 || ents[0].Name() != fmt.Sprintf("rank-%d.pt", k) {
			t.Fatalf("%s keeps %v (%v), want its own rank-%d.pt", part, ents, err, k)
		}
	}
}

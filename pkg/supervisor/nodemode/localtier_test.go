package nodemode

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/internal/testutil/trainertest"
	"github.com/spotagent/spotagent/pkg/protocol"
)

// TestNode_LocalTierKeepsEachPart (#38): in node mode each node of a job
// keeps its own part of the shutdown checkpoint (hard links: a stop's
// checkpoint is never copied while the trainer waits), in its run's area.
func TestNode_LocalTierKeepsEachPart(t *testing.T) {
	n := startNode(t, nil, func(c *Config) { c.Run.LocalKeep = 1 })
	pods := []*trainertest.Trainer{n.dialAs(t, "pod:a"), n.dialAs(t, "pod:b")}
	for k, tr := range pods {
		tr.Send(map[string]any{"type": "hello", "pid": os.Getpid(), "run_id": "job", "rank": k, "world_size": 2,
			"local_rank": 0, "local_world_size": 1, "node_rank": k, "nodes": 2})
		tr.Expect(protocol.TypeWelcome)
	}
	n.sigs <- syscall.SIGTERM
	var id string
	for k, tr := range pods {
		req := tr.Expect(protocol.TypeCheckpoint)
		if k == 1 && req.ID != id {
			tr.Send(map[string]any{"type": "join", "id": id, "reason": req.Reason, "deadline": req.Deadline})
			req = tr.Expect(protocol.TypeCheckpoint)
		}
		id = req.ID
		testutil.WriteFile(t, filepath.Join(req.Dir, fmt.Sprintf("rank-%d.pt", k)), fmt.Sprint(k))
		tr.Send(map[string]any{"type": "done", "id": req.ID, "step": 40})
	}
	for _, tr := range pods {
		tr.Expect(protocol.TypeCommitted)
	}
	for k := range pods {
		part := fmt.Sprintf("node-%d", k)
		kept := filepath.Join(filepath.Dir(n.sock), "ckpt", "job", part, "spotagent-job", "committed", "000000000040-"+id)
		ents, err := os.ReadDir(kept)
		if err != nil || len(ents) != 1 || ents[0].Name() != fmt.Sprintf("rank-%d.pt", k) {
			t.Fatalf("%s keeps %v (%v), want its own rank-%d.pt", part, ents, err, k)
		}
	}
}

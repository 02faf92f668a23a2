package nodemode

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/internal/testutil/trainertest"
	"github.com/spotagent/spotagent/pkg/protocol"
)

// Review 12: a node-mode run's agent lives on while any connection of it
// is open (or an upload is in flight), and answers every hello with the
// resume its start restored (boot.resume), never with what it committed
// since. A pod with two ranks: rank 0 commits step 10, then its process
// restarts (a crash, torchrun's restart of the worker) while rank 1 is
// still connected; rank 0's new hello is welcomed with the start's resume
// (none: a fresh start), though step 10 is committed: it trains from
// scratch. A newer committed checkpoint exists and an older one (here
// none) is resumed.
func TestNode_RankBackAfterCommitResumesIt(t *testing.T) {
	n := startNode(t, nil)
	hello := func(rank int) (*trainertest.Trainer, protocol.Message) {
		tr := n.dialAs(t, "pod:a")
		tr.Send(map[string]any{"type": "hello", "pid": os.Getpid(), "rank": rank, "world_size": 2, "run_id": "rejoin"})
		return tr, tr.Expect(protocol.TypeWelcome)
	}
	r0, w0 := hello(0)
	r1, _ := hello(1)
	defer r1.Close()
	if w0.Resume != nil {
		t.Fatalf("first welcome resumes %+v, want a fresh start", w0.Resume)
	}
	own := filepath.Join(w0.CheckpointDir, "mine")
	testutil.WriteFile(t, filepath.Join(own, "w.pt"), "step 10")
	r0.Send(map[string]any{"type": "done", "step": 10, "dir": own})
	if c := r0.Expect(protocol.TypeCommitted); c.Step == nil || *c.Step != 10 {
		t.Fatalf("committed %+v, want step 10", c)
	}
	r0.Close()
	r0b, w := hello(0)
	defer r0b.Close()
	if w.Resume == nil || w.Resume.Step != 10 {
		t.Fatalf("rank 0 back after committing step 10 is welcomed with resume %+v: it starts over though step 10 is committed", w.Resume)
	}
}

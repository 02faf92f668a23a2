package supervisor

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/internal/testutil/trainertest"
	"github.com/spotagent/spotagent/pkg/protocol"
)

// Review 12: sidecar mode (no command): the trainer container commits
// step 7, then crashes and is restarted by the kubelet while the sidecar
// agent runs on. Its new hello is welcomed with the resume the agent's
// start restored (here none), never with step 7: it trains from scratch
// though a newer committed checkpoint exists.
func TestReview12_SidecarTrainerRestartResumesStale(t *testing.T) {
	ar := startAgent(t, nil)
	tr := trainertest.Dial(t, ar.cfg.Server.Path)
	if w := tr.Hello(); w.Resume != nil {
		t.Fatalf("first welcome resumes %+v", w.Resume)
	}
	own := filepath.Join(ar.cfg.CheckpointDir, "mine")
	testutil.WriteFile(t, filepath.Join(own, "w.pt"), "step 7")
	tr.Send(map[string]any{"type": "done", "step": 7, "dir": own, "pid": os.Getpid()})
	if c := tr.Expect(protocol.TypeCommitted); c.Step == nil || *c.Step != 7 {
		t.Fatalf("committed %+v", c)
	}
	tr.Close()
	w := trainertest.Dial(t, ar.cfg.Server.Path).Hello()
	if w.Resume == nil || w.Resume.Step != 7 {
		t.Fatalf("the restarted trainer is welcomed with resume %+v: it starts over though step 7 is committed", w.Resume)
	}
}

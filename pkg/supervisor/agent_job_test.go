package supervisor

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"
)

// Issue 15: two agents, one per node, one store; the job's ranks agree on
// one checkpoint (the test plays the collective: rank 0 joins the id rank
// 1's agent asked for) and its two parts commit as one checkpoint.

// startJobNode starts node k's agent of a two-node job sharing store dir.
func startJobNode(t *testing.T, storeOf *agentRun, k int) *agentRun {
	t.Helper()
	return startAgent(t, func(c *Config) {
		c.Node = NodePart(k)
		if storeOf != nil {
			c.Store = storeOf.store
		}
	})
}

// helloRank says hello as global rank r of a world of 2, one rank per node.
func (tr *trainer) helloRank(r int) Message {
	tr.send(map[string]any{"type": "hello", "pid": os.Getpid(), "rank": r, "world_size": 2,
		"local_rank": 0, "local_world_size": 1, "node_rank": r, "nodes": 2})
	return tr.expect(TypeWelcome)
}

func TestJob_JoinCommitsOneCheckpoint(t *testing.T) {
	n0 := startJobNode(t, nil, 0)
	n1 := startJobNode(t, n0, 1)
	t0, t1 := dialTrainer(t, n0.cfg.Server.Path), dialTrainer(t, n1.cfg.Server.Path)
	t0.helloRank(0)
	t1.helloRank(1)

	n1.sigs <- syscall.SIGTERM // node 1 alone is told to shut down
	req1 := t1.expect(TypeCheckpoint)
	if req1.Reason != ReasonShutdown {
		t.Fatalf("node 1 asked for %q, want shutdown", req1.Reason)
	}
	// The collective told rank 0 the job's checkpoint; its agent never asked.
	t0.send(map[string]any{"type": "join", "id": req1.ID, "reason": req1.Reason, "deadline": req1.Deadline, "step": 7})
	req0 := t0.expect(TypeCheckpoint)
	if req0.ID != req1.ID || req0.Reason != ReasonShutdown || !req0.Deadline.Equal(*req1.Deadline) {
		t.Fatalf("joined request %+v, want id %s, shutdown, deadline %v", req0, req1.ID, req1.Deadline)
	}
	if req0.Dir == req1.Dir || !strings.HasPrefix(req0.Dir, n0.cfg.CheckpointDir) {
		t.Fatalf("node 0's directory %s must be its own (node 1: %s)", req0.Dir, req1.Dir)
	}
	// A second join for the same id is answered with the same request.
	t0.send(map[string]any{"type": "join", "id": req1.ID, "reason": req1.Reason, "deadline": req1.Deadline})
	if again := t0.expect(TypeCheckpoint); again.Dir != req0.Dir {
		t.Fatalf("second join: dir %s, want %s", again.Dir, req0.Dir)
	}
	mustWrite(t, filepath.Join(req0.Dir, "rank-0.pt"), "zero")
	mustWrite(t, filepath.Join(req1.Dir, "rank-1.pt"), "one")
	t1.send(map[string]any{"type": "done", "id": req1.ID, "step": 7})
	// Node 1's part alone is not a checkpoint.
	if _, err := checkpoint.ReadLatest(context.Background(), n0.store); err == nil {
		t.Fatal("latest.json written with one part of two")
	}
	t0.send(map[string]any{"type": "done", "id": req0.ID, "step": 7})
	c0, c1 := t0.expect(TypeCommitted), t1.expect(TypeCommitted)
	if c0.URI != c1.URI {
		t.Fatalf("the nodes committed different checkpoints: %s and %s", c0.URI, c1.URI)
	}
	t0.expect(TypeStop) // the joined node stops too
	t1.expect(TypeStop)
	l, err := checkpoint.ReadLatest(context.Background(), n0.store)
	if err != nil {
		t.Fatal(err)
	}
	m, err := checkpoint.ReadManifest(context.Background(), n0.store, l.Manifest)
	if err != nil {
		t.Fatal(err)
	}
	if m.Step != 7 || len(m.Parts) != 2 || len(m.Files) != 2 {
		t.Fatalf("job manifest: step %d, %d parts, %d files; want 7, 2, 2", m.Step, len(m.Parts), len(m.Files))
	}
	// Each node restores its own part by default.
	r, err := checkpoint.Restore(context.Background(), n0.store, t.TempDir(), checkpoint.RestoreOptions{Part: NodePart(1)})
	if err != nil {
		t.Fatal(err)
	}
	if got := mustRead(t, filepath.Join(r.Dir, "rank-1.pt")); got != "one" {
		t.Fatalf("restored rank-1.pt = %q", got)
	}
	if _, err := os.Stat(filepath.Join(r.Dir, "rank-0.pt")); err == nil {
		t.Fatal("node 1's restore fetched node 0's part")
	}
}

func TestJob_JoinRefused(t *testing.T) {
	n0 := startJobNode(t, nil, 0)
	t0 := dialTrainer(t, n0.cfg.Server.Path)
	t0.helloRank(0)
	future := time.Now().Add(time.Minute).UTC()
	past := time.Now().Add(-time.Minute).UTC()
	for _, tc := range []struct {
		msg  map[string]any
		want string
	}{
		{map[string]any{"type": "join", "id": "../../etc", "reason": "periodic", "deadline": future}, "12 lowercase hex"},
		{map[string]any{"type": "join", "id": "ABCDEF012345", "reason": "periodic", "deadline": future}, "12 lowercase hex"},
		{map[string]any{"type": "join", "id": "abcdef012345", "reason": "whenever", "deadline": future}, "unknown reason"},
		{map[string]any{"type": "join", "id": "abcdef012345", "reason": "periodic"}, "deadline"},
		{map[string]any{"type": "join", "id": "abcdef012345", "reason": "periodic", "deadline": past}, "deadline"},
	} {
		t0.send(tc.msg)
		e := t0.expect(TypeError)
		if !strings.Contains(e.Error, tc.want) {
			t.Errorf("join %v: error %q, want %q", tc.msg, e.Error, tc.want)
		}
	}
	// Only a trainer (a connection that said hello) can join.
	stranger := dialTrainer(t, n0.cfg.Server.Path)
	stranger.send(map[string]any{"type": "join", "id": "abcdef012345", "reason": "periodic", "deadline": future})
	if e := stranger.expect(TypeError); !strings.Contains(e.Error, "hello first") {
		t.Errorf("join without hello: error %q", e.Error)
	}
	// A request of this agent's own that lost the agreement is dropped
	// for the job's: one request pending, in the job's id.
	t0.send(map[string]any{"type": "join", "id": "abcdef012345", "reason": "periodic", "deadline": future})
	if req := t0.expect(TypeCheckpoint); req.ID != "abcdef012345" {
		t.Fatalf("joined request id %s", req.ID)
	}
	t0.send(map[string]any{"type": "join", "id": "0123456789ab", "reason": "interruption", "deadline": future})
	req := t0.expect(TypeCheckpoint)
	if req.ID != "0123456789ab" || req.Reason != ReasonInterruption {
		t.Fatalf("second join: %+v", req)
	}
	n0.waitStatus(t, "one pending request", func(s Status) bool { return s.Pending == 1 })
}

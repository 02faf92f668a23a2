package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/internal/testutil/trainertest"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/restore"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/file"
	"github.com/spotagent/spotagent/pkg/protocol"
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
func helloRank(tr *trainertest.Trainer, r int) protocol.Message {
	return tr.HelloJob(r, 2, 0, 1, r, 2)
}

func TestJob_JoinCommitsOneCheckpoint(t *testing.T) {
	n0 := startJobNode(t, nil, 0)
	n1 := startJobNode(t, n0, 1)
	t0, t1 := trainertest.Dial(t, n0.cfg.Server.Path), trainertest.Dial(t, n1.cfg.Server.Path)
	helloRank(t0, 0)
	helloRank(t1, 1)

	n1.sigs <- syscall.SIGTERM // node 1 alone is told to shut down
	req1 := t1.Expect(protocol.TypeCheckpoint)
	if req1.Reason != protocol.ReasonShutdown {
		t.Fatalf("node 1 asked for %q, want shutdown", req1.Reason)
	}
	// The collective told rank 0 the job's checkpoint; its agent never asked.
	t0.Send(map[string]any{"type": "join", "id": req1.ID, "reason": req1.Reason, "deadline": req1.Deadline, "step": 7})
	req0 := t0.Expect(protocol.TypeCheckpoint)
	if req0.ID != req1.ID || req0.Reason != protocol.ReasonShutdown || !req0.Deadline.Equal(*req1.Deadline) {
		t.Fatalf("joined request %+v, want id %s, shutdown, deadline %v", req0, req1.ID, req1.Deadline)
	}
	if req0.Dir == req1.Dir || !strings.HasPrefix(req0.Dir, n0.cfg.CheckpointDir) {
		t.Fatalf("node 0's directory %s must be its own (node 1: %s)", req0.Dir, req1.Dir)
	}
	// A second join for the same id is answered with the same request.
	t0.Send(map[string]any{"type": "join", "id": req1.ID, "reason": req1.Reason, "deadline": req1.Deadline})
	if again := t0.Expect(protocol.TypeCheckpoint); again.Dir != req0.Dir {
		t.Fatalf("second join: dir %s, want %s", again.Dir, req0.Dir)
	}
	testutil.WriteFile(t, filepath.Join(req0.Dir, "rank-0.pt"), "zero")
	testutil.WriteFile(t, filepath.Join(req1.Dir, "rank-1.pt"), "one")
	t1.Send(map[string]any{"type": "done", "id": req1.ID, "step": 7})
	// Node 1's part alone is not a checkpoint.
	if _, err := checkpoint.ReadLatest(context.Background(), n0.store); err == nil {
		t.Fatal("latest.json written with one part of two")
	}
	t0.Send(map[string]any{"type": "done", "id": req0.ID, "step": 7})
	c0, c1 := t0.Expect(protocol.TypeCommitted), t1.Expect(protocol.TypeCommitted)
	if c0.URI != c1.URI {
		t.Fatalf("the nodes committed different checkpoints: %s and %s", c0.URI, c1.URI)
	}
	t0.Expect(protocol.TypeStop) // the joined node stops too
	t1.Expect(protocol.TypeStop)
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
	r, err := restore.Checkpoint(context.Background(), n0.store, t.TempDir(), restore.Options{Part: NodePart(1)})
	if err != nil {
		t.Fatal(err)
	}
	if got := testutil.ReadFile(t, filepath.Join(r.Dir, "rank-1.pt")); got != "one" {
		t.Fatalf("restored rank-1.pt = %q", got)
	}
	if _, err := os.Stat(filepath.Join(r.Dir, "rank-0.pt")); err == nil {
		t.Fatal("node 1's restore fetched node 0's part")
	}
}

func TestJob_JoinRefused(t *testing.T) {
	n0 := startJobNode(t, nil, 0)
	t0 := trainertest.Dial(t, n0.cfg.Server.Path)
	helloRank(t0, 0)
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
		t0.Send(tc.msg)
		e := t0.Expect(protocol.TypeError)
		if !strings.Contains(e.Error, tc.want) {
			t.Errorf("join %v: error %q, want %q", tc.msg, e.Error, tc.want)
		}
	}
	// Only a trainer (a connection that said hello) can join.
	stranger := trainertest.Dial(t, n0.cfg.Server.Path)
	stranger.Send(map[string]any{"type": "join", "id": "abcdef012345", "reason": "periodic", "deadline": future})
	if e := stranger.Expect(protocol.TypeError); !strings.Contains(e.Error, "hello first") {
		t.Errorf("join without hello: error %q", e.Error)
	}
	// A request of this agent's own that lost the agreement is dropped
	// for the job's: one request pending, in the job's id.
	t0.Send(map[string]any{"type": "join", "id": "abcdef012345", "reason": "periodic", "deadline": future})
	if req := t0.Expect(protocol.TypeCheckpoint); req.ID != "abcdef012345" {
		t.Fatalf("joined request id %s", req.ID)
	}
	t0.Send(map[string]any{"type": "join", "id": "0123456789ab", "reason": "interruption", "deadline": future})
	req := t0.Expect(protocol.TypeCheckpoint)
	if req.ID != "0123456789ab" || req.Reason != protocol.ReasonInterruption {
		t.Fatalf("second join: %+v", req)
	}
	n0.waitStatus(t, "one pending request", func(s Status) bool { return s.Pending == 1 })
}

// Issue 24.1: a rank's own SIGTERM (the kubelet's: a native sidecar is
// signalled after the trainer) is offered to the job as a shutdown that no
// agent asked for, so it has no deadline. Every rank joins it; every
// agent takes it with its own grace, and one job checkpoint commits.
func TestJob_ShutdownJoinWithoutDeadline(t *testing.T) {
	n0 := startJobNode(t, nil, 0)
	n1 := startJobNode(t, n0, 1)
	t0, t1 := trainertest.Dial(t, n0.cfg.Server.Path), trainertest.Dial(t, n1.cfg.Server.Path)
	helloRank(t0, 0)
	helloRank(t1, 1)
	const id = "5151abcdef00"
	before := time.Now()
	t1.Send(map[string]any{"type": "join", "id": id, "reason": "shutdown", "step": 12})
	t0.Send(map[string]any{"type": "join", "id": id, "reason": "shutdown", "step": 12})
	r0, r1 := t0.Expect(protocol.TypeCheckpoint), t1.Expect(protocol.TypeCheckpoint)
	for _, r := range []protocol.Message{r0, r1} {
		if r.ID != id || r.Reason != protocol.ReasonShutdown || r.Deadline == nil || !r.Deadline.After(before) ||
			r.Deadline.After(before.Add(n0.cfg.TermGrace)) {
			t.Fatalf("joined request %+v: want id %s, shutdown, a deadline within --term-grace", r, id)
		}
	}
	testutil.WriteFile(t, filepath.Join(r0.Dir, "rank-0.pt"), "zero")
	testutil.WriteFile(t, filepath.Join(r1.Dir, "rank-1.pt"), "one")
	t0.Send(map[string]any{"type": "done", "id": id, "step": 12})
	t1.Send(map[string]any{"type": "done", "id": id, "step": 12})
	t0.Expect(protocol.TypeCommitted)
	t1.Expect(protocol.TypeCommitted)
	t0.Expect(protocol.TypeStop)
	t1.Expect(protocol.TypeStop)
	l, err := checkpoint.ReadLatest(context.Background(), n0.store)
	if err != nil || l.Step != 12 || l.ID != id {
		t.Fatalf("latest %+v, %v: want the job's shutdown checkpoint at step 12", l, err)
	}
}

// Issue 24.11: the periodic request reaches the one local rank that said
// hello; the node's second rank connects a few ms later and joins after
// the first answered done. The part waits for it, and the job checkpoint
// holds every rank.
func TestJob_LateLocalRankJoinsThePart(t *testing.T) {
	n0 := startJobNode(t, nil, 0)
	n1 := startJobNode(t, n0, 1)
	a, b := trainertest.Dial(t, n0.cfg.Server.Path), trainertest.Dial(t, n1.cfg.Server.Path)
	a.HelloJob(0, 3, 0, 2, 0, 2) // node 0 runs ranks 0 and 1
	b.HelloJob(2, 3, 0, 1, 1, 2) // node 1 runs rank 2
	n0.sigs <- syscall.SIGTERM
	req := a.Expect(protocol.TypeCheckpoint)
	testutil.WriteFile(t, filepath.Join(req.Dir, "rank-0.pt"), "zero")
	a.Send(map[string]any{"type": "done", "id": req.ID, "step": 30})
	n0.waitStatus(t, "rank 0's done", func(s Status) bool { return s.Pending == 1 })

	late := trainertest.Dial(t, n0.cfg.Server.Path)
	late.HelloJob(1, 3, 1, 2, 0, 2)
	late.Send(map[string]any{"type": "join", "id": req.ID, "reason": req.Reason, "deadline": req.Deadline, "step": 30})
	lr := late.Expect(protocol.TypeCheckpoint)
	if lr.ID != req.ID || lr.Dir != req.Dir {
		t.Fatalf("late rank's request %+v, want %s in %s", lr, req.ID, req.Dir)
	}
	testutil.WriteFile(t, filepath.Join(lr.Dir, "rank-1.pt"), "one")
	late.Send(map[string]any{"type": "done", "id": req.ID, "step": 30})
	b.Send(map[string]any{"type": "join", "id": req.ID, "reason": req.Reason, "deadline": req.Deadline, "step": 30})
	br := b.Expect(protocol.TypeCheckpoint)
	testutil.WriteFile(t, filepath.Join(br.Dir, "rank-2.pt"), "two")
	b.Send(map[string]any{"type": "done", "id": req.ID, "step": 30})
	a.Expect(protocol.TypeCommitted)
	b.Expect(protocol.TypeCommitted)
	l, err := checkpoint.ReadLatest(context.Background(), n0.store)
	if err != nil {
		t.Fatal(err)
	}
	m, err := checkpoint.ReadManifest(context.Background(), n0.store, l.Manifest)
	if err != nil {
		t.Fatal(err)
	}
	if p := m.Part(NodePart(0)); p == nil || len(p.Ranks) != 2 || len(m.Files) != 3 {
		t.Fatalf("job manifest parts %+v, %d files: want node-0 with ranks [0 1] and 3 files", m.Parts, len(m.Files))
	}
}

// Issue 24.2: in part mode a checkpoint one rank took on its own, or one
// whose trainer said no rank, is never a job checkpoint.
func TestJob_RefusesWhatIsNoPart(t *testing.T) {
	n0 := startJobNode(t, nil, 0)
	tr := trainertest.Dial(t, n0.cfg.Server.Path)
	helloRank(tr, 0)
	own := filepath.Join(n0.cfg.CheckpointDir, "mine")
	testutil.WriteFile(t, filepath.Join(own, "rank-0.pt"), "zero")
	tr.Send(map[string]any{"type": "done", "id": "", "step": 150, "dir": own})
	if e := tr.Expect(protocol.TypeError); !strings.Contains(e.Error, "every rank saves together") {
		t.Fatalf("unsolicited done: %q", e.Error)
	}

	n1 := startJobNode(t, nil, 1)
	anon := trainertest.Dial(t, n1.cfg.Server.Path)
	anon.Send(map[string]any{"type": "hello", "pid": os.Getpid()}) // no rank, no world
	anon.Expect(protocol.TypeWelcome)
	n1.sigs <- syscall.SIGTERM
	req := anon.Expect(protocol.TypeCheckpoint)
	testutil.WriteFile(t, filepath.Join(req.Dir, "x.pt"), "x")
	anon.Send(map[string]any{"type": "done", "id": req.ID, "step": 3})
	if f := anon.Expect(protocol.TypeUploadFailed); !strings.Contains(f.Error, "said its rank") {
		t.Fatalf("rankless part: %q", f.Error)
	}
	for _, st := range []*agentRun{n0, n1} {
		n := 0
		st.store.List(context.Background(), "", func(o cloud.ObjectInfo) error {
			if strings.HasPrefix(o.Key, "checkpoints/") {
				n++
			}
			return nil
		})
		if n != 0 {
			t.Fatalf("%d checkpoint objects in the store; want none", n)
		}
	}
}

// Issue 24.5: a trainer that is no rank of a multi-rank job cannot join
// (in node mode a pod sent join reason=interruption in a loop); a rank of
// a single-node multi-rank job can (a SIGTERM on one of its ranks).
func TestJoin_OnlyRanksOfAJob(t *testing.T) {
	ar := startAgent(t, nil)
	single := trainertest.Dial(t, ar.cfg.Server.Path)
	single.Hello() // world_size 1
	future := time.Now().Add(time.Minute).UTC()
	single.Send(map[string]any{"type": "join", "id": "abcdef012345", "reason": "interruption", "deadline": future})
	if e := single.Expect(protocol.TypeError); !strings.Contains(e.Error, "multi-rank") {
		t.Fatalf("join from a single trainer: %q", e.Error)
	}
	ar.waitStatus(t, "no request", func(s Status) bool { return s.Pending == 0 })
	// Another run: beside the single trainer, a rank 1 of 2 is no rank of
	// its job (pkg/supervisor/internal/trainers, declaredRanks) and could not join.
	multi := startAgent(t, nil)
	rank := trainertest.Dial(t, multi.cfg.Server.Path)
	rank.Send(map[string]any{"type": "hello", "pid": os.Getpid(), "rank": 1, "world_size": 2})
	rank.Expect(protocol.TypeWelcome)
	rank.Send(map[string]any{"type": "join", "id": "abcdef012345", "reason": "shutdown"})
	if r := rank.Expect(protocol.TypeCheckpoint); r.ID != "abcdef012345" {
		t.Fatalf("join from a rank: %+v", r)
	}
}

// --signal and --watch have no ranks and no agreement: with --node-rank
// each node's checkpoint would stand for the whole job (issue 24.2).
func TestConfig_NodeRefusesSignalAndWatch(t *testing.T) {
	dir := testutil.ShortDir(t)
	st, err := file.New(filepath.Join(dir, "store"))
	if err != nil {
		t.Fatal(err)
	}
	for name, mutate := range map[string]func(*Config){
		"signal": func(c *Config) { c.Signal = syscall.SIGUSR1 },
		"watch":  func(c *Config) { c.Watch = &WatchConfig{} },
	} {
		cfg := Config{RunID: "x", CheckpointDir: filepath.Join(dir, "ckpt"), Store: st, Node: NodePart(1),
			Server: protocol.ServerConfig{Path: filepath.Join(dir, name+".sock")}, Command: []string{"true"}}
		mutate(&cfg)
		if _, err := Run(context.Background(), cfg, nil); err == nil || !strings.Contains(err.Error(), "--node-rank") {
			t.Errorf("%s with a node rank: %v, want a refusal naming --node-rank", name, err)
		}
	}
}

// Issue 24.3, agent side: a second live copy of node 1 starts (a spot
// replacement while the old machine still runs). The old copy's next part
// is refused (fenced: upload_failed, then stop with reason fenced) and
// the job checkpoint committed before stays whole.
func TestJob_SecondCopyOfANodeFencesTheFirst(t *testing.T) {
	n0 := startJobNode(t, nil, 0)
	a := startJobNode(t, n0, 1)
	t0, ta := trainertest.Dial(t, n0.cfg.Server.Path), trainertest.Dial(t, a.cfg.Server.Path)
	helloRank(t0, 0)
	helloRank(ta, 1)
	future := time.Now().Add(time.Minute).UTC()
	save := func(tr *trainertest.Trainer, id string, rank int, body string, step int64) {
		tr.Send(map[string]any{"type": "join", "id": id, "reason": "periodic", "deadline": future})
		req := tr.Expect(protocol.TypeCheckpoint)
		testutil.WriteFile(t, filepath.Join(req.Dir, fmt.Sprintf("rank-%d.pt", rank)), body)
		tr.Send(map[string]any{"type": "done", "id": id, "step": step})
	}
	save(t0, "100000000000", 0, "zero@100", 100)
	save(ta, "100000000000", 1, "one@100", 100)
	t0.Expect(protocol.TypeCommitted)
	ta.Expect(protocol.TypeCommitted)

	b := startJobNode(t, n0, 1) // the second copy of node 1
	tb := trainertest.Dial(t, b.cfg.Server.Path)
	if w := helloRank(tb, 1); w.Resume == nil || w.Resume.Step != 100 {
		t.Fatalf("second copy's welcome %+v: want the resume of step 100", w.Resume)
	}
	save(ta, "200000000000", 1, "stale@200", 200)
	if f := ta.Expect(protocol.TypeUploadFailed); !strings.Contains(f.Error, "fenced") {
		t.Fatalf("the old copy's part: %q, want fenced", f.Error)
	}
	if s := ta.Expect(protocol.TypeStop); s.Reason != reasonFenced {
		t.Fatalf("the old copy's stop: %+v", s)
	}
	l, err := checkpoint.ReadLatest(context.Background(), n0.store)
	if err != nil || l.Step != 100 {
		t.Fatalf("latest %+v, %v: want step 100", l, err)
	}
	r, err := restore.Checkpoint(context.Background(), n0.store, t.TempDir(), restore.Options{Part: NodePart(1)})
	if err != nil {
		t.Fatal(err)
	}
	if got := testutil.ReadFile(t, filepath.Join(r.Dir, "rank-1.pt")); got != "one@100" {
		t.Fatalf("node 1's committed rank-1.pt = %q, want one@100", got)
	}
}

// unreadableManifests fails every read of a job manifest while armed.
type unreadableManifests struct {
	cloud.Store
	armed atomic.Bool
}

func (s *unreadableManifests) Get(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	if s.armed.Load() && strings.HasSuffix(key, "/"+checkpoint.ManifestName) {
		return nil, errors.New("injected: manifest unreadable")
	}
	return s.Store.Get(ctx, key, off, n)
}

// TestJob_RankBackAfterItsNodesCommitFailedResumesTheJob: node 1's part is
// written, rank 0's agent commits the job checkpoint with it, but node 1's
// agent never reads that manifest (its commit fails: upload_failed). Its
// rank, back, resumes the job checkpoint from the store, not a fresh start
// beside node 0's ranks at step 7 (agent simulation seed 792).
func TestJob_RankBackAfterItsNodesCommitFailedResumesTheJob(t *testing.T) {
	n0 := startJobNode(t, nil, 0)
	var flaky *unreadableManifests
	n1 := startAgent(t, func(c *Config) {
		c.Node = NodePart(1)
		flaky = &unreadableManifests{Store: n0.store}
		flaky.armed.Store(true)
		c.Store = flaky
	})
	t0, t1 := trainertest.Dial(t, n0.cfg.Server.Path), trainertest.Dial(t, n1.cfg.Server.Path)
	helloRank(t0, 0)
	helloRank(t1, 1)
	// The job's ranks agree on checkpoint id: each joins it.
	id, deadline := "0123456789ab", time.Now().Add(time.Minute).UTC()
	for _, tr := range []*trainertest.Trainer{t0, t1} {
		tr.Send(map[string]any{"type": "join", "id": id, "reason": "periodic", "deadline": deadline, "step": 7})
	}
	req0, req1 := t0.Expect(protocol.TypeCheckpoint), t1.Expect(protocol.TypeCheckpoint)
	testutil.WriteFile(t, filepath.Join(req0.Dir, "w.pt"), "step rank0")
	testutil.WriteFile(t, filepath.Join(req1.Dir, "w.pt"), "step rank1")
	t0.Send(map[string]any{"type": "done", "id": id, "step": 7})
	t1.Send(map[string]any{"type": "done", "id": id, "step": 7})
	t0.Expect(protocol.TypeCommitted)
	// Node 1 waits for the manifest, then assembles it too (commit's
	// assembleAfter, 5 s) and cannot read the one that won.
	if m, ok := t1.Next(protocol.TypeUploadFailed, time.Minute); !ok || m.ID != id {
		t.Fatalf("node 1: upload_failed %+v (%v), want one for %s", m, ok, id)
	}
	flaky.armed.Store(false)
	t1.Close()
	back := trainertest.Dial(t, n1.cfg.Server.Path)
	back.Send(map[string]any{"type": "hello", "pid": os.Getpid(), "version": 2, "rank": 1, "world_size": 2,
		"local_rank": 0, "local_world_size": 1, "node_rank": 1, "nodes": 2})
	w := back.Expect(protocol.TypeWelcome)
	r := w.Resume
	if w.Restore == protocol.RestorePending {
		r = back.Expect(protocol.TypeRestored).Resume
	}
	if r == nil || r.Step != 7 || r.ID != id {
		t.Fatalf("rank 1 back: resume %+v, want the job checkpoint %s at step 7", r, id)
	}
	if got := testutil.ReadFile(t, filepath.Join(r.Dir, "w.pt")); got != "step rank1" {
		t.Fatalf("rank 1's w.pt = %q, want its own part's", got)
	}
}

// TestJob_RankDiesMidSave: a job of two nodes × two ranks commits step
// 10; at step 20 rank 3 goes away instead of answering. Its node abandons
// its part (logged `checkpoint abandoned`) and tells its other rank
// (upload_failed, "abandoned") at once, not at the deadline; the job
// checkpoint never commits though node 0's ranks save theirs, and the
// previous one stands, every rank's file of step 10. (The end-to-end
// TestDistributed_RankDiesMidSave was cut in #49.)
func TestJob_RankDiesMidSave(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	n0 := startJobNode(t, nil, 0)
	n1 := startAgent(t, func(c *Config) { c.Node, c.Store, c.Log = NodePart(1), n0.store, zap.New(core) })
	var ranks []*trainertest.Trainer
	for r := 0; r < 4; r++ {
		n := []*agentRun{n0, n1}[r/2]
		tr := trainertest.Dial(t, n.cfg.Server.Path)
		tr.HelloJob(r, 4, r%2, 2, r/2, 2)
		ranks = append(ranks, tr)
	}
	rankFile := func(step int64, r int) string { return fmt.Sprintf("step=%d rank=%d", step, r) }
	// join: rank r joins the job's checkpoint id (its agent asks its
	// node's ranks); save: rank r saves its file and says done.
	join := func(r int, id string, step int64, deadline time.Time) {
		ranks[r].Send(map[string]any{"type": "join", "id": id, "reason": "periodic", "deadline": deadline, "step": step})
	}
	save := func(r int, id string, step int64) {
		req := ranks[r].Expect(protocol.TypeCheckpoint)
		if req.ID != id {
			t.Fatalf("rank %d asked for %s, want %s", r, req.ID, id)
		}
		testutil.WriteFile(t, filepath.Join(req.Dir, fmt.Sprintf("rank-%d.bin", r)), rankFile(step, r))
		ranks[r].Send(map[string]any{"type": "done", "id": id, "step": step})
	}
	for _, r := range []int{0, 2} {
		join(r, "00000000000a", 10, time.Now().Add(time.Minute).UTC())
	}
	for r := range ranks {
		save(r, "00000000000a", 10)
	}
	for r, tr := range ranks {
		if c := tr.Expect(protocol.TypeCommitted); c.ID != "00000000000a" {
			t.Fatalf("rank %d: committed %+v, want step 10's", r, c)
		}
	}

	// Step 20: rank 2 saves, rank 3 is asked and goes away.
	const id = "000000000014"
	deadline := time.Now().Add(time.Minute).UTC() // told long before it: Expect waits testutil.Wait
	join(2, id, 20, deadline)
	save(2, id, 20)
	if req := ranks[3].Expect(protocol.TypeCheckpoint); req.ID != id {
		t.Fatalf("rank 3 asked for %s, want %s", req.ID, id)
	}
	ranks[3].Close()
	f := ranks[2].Expect(protocol.TypeUploadFailed)
	if f.ID != id || !strings.Contains(f.Error, "abandoned") || !time.Now().Before(deadline) {
		t.Fatalf("rank 2: %+v at %v, want upload_failed for %s saying abandoned, before the deadline %v", f, time.Now(), id, deadline)
	}
	if es := logs.FilterMessage("checkpoint abandoned").FilterField(zap.String("id", id)).All(); len(es) != 1 {
		t.Fatalf("node 1 logged %v, want one 'checkpoint abandoned' of %s", es, id)
	}
	join(0, id, 20, deadline)
	for r := 0; r < 2; r++ {
		save(r, id, 20)
	}
	// Node 0 does all it can: its part is in the store. Node 1's never is
	// (nothing of it uploaded), so neither is the job's manifest.
	dir := "checkpoints/000000000020-" + id + "/"
	testutil.WaitFor(t, "node 0's part of step 20 in the store", func() bool {
		_, err := n0.store.Stat(context.Background(), dir+"parts/node-0.json")
		return err == nil
	})
	n0.store.List(context.Background(), dir, func(o cloud.ObjectInfo) error {
		if !strings.HasPrefix(o.Key, dir+"node-0/") && o.Key != dir+"parts/node-0.json" {
			t.Errorf("%s in the store: only node 0's part of step 20 may be", o.Key)
		}
		return nil
	})
	if l, err := checkpoint.ReadLatest(context.Background(), n0.store); err != nil || l.Step != 10 {
		t.Fatalf("latest %+v %v, want step 10", l, err)
	}
	r, err := restore.Checkpoint(context.Background(), n0.store, testutil.ShortDir(t), restore.Options{})
	if err != nil || r.Manifest.Step != 10 {
		t.Fatalf("restore: %+v %v, want step 10", r, err)
	}
	for k := range ranks {
		if got := testutil.ReadFile(t, filepath.Join(r.Dir, fmt.Sprintf("rank-%d.bin", k))); got != rankFile(10, k) {
			t.Fatalf("restored rank %d's file %q, want step 10's", k, got)
		}
	}
}

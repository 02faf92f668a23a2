package supervisor

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/internal/testutil/noticetest"
	"github.com/spotagent/spotagent/internal/testutil/trainertest"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/protocol"
)

// commitOwn has tr commit step from its own directory name below the
// checkpoint directory (an unasked done) and waits for committed.
func commitOwn(t *testing.T, ar *agentRun, tr *trainertest.Trainer, name string, step int64) {
	t.Helper()
	own := filepath.Join(ar.cfg.CheckpointDir, name)
	testutil.WriteFile(t, filepath.Join(own, "w.pt"), "step "+name)
	tr.Send(map[string]any{"type": "done", "step": step, "dir": own, "pid": os.Getpid()})
	if c := tr.Expect(protocol.TypeCommitted); c.Step == nil || *c.Step != step {
		t.Fatalf("committed %+v, want step %d", c, step)
	}
}

// checkResume fails unless r names step in the agent's restore area,
// holding what the trainer committed for it (name).
func checkResume(t *testing.T, ar *agentRun, r *protocol.Resume, step int64, name string) {
	t.Helper()
	if r == nil || r.Step != step {
		t.Fatalf("resume %+v, want step %d: a newer committed checkpoint exists", r, step)
	}
	if !strings.Contains(r.Dir, string(filepath.Separator)+"restore"+string(filepath.Separator)) {
		t.Fatalf("resume dir %s is not in the agent's restore area", r.Dir)
	}
	if b, err := os.ReadFile(filepath.Join(r.Dir, "w.pt")); err != nil || string(b) != "step "+name {
		t.Fatalf("restored w.pt = %q, %v; want %q", b, err, "step "+name)
	}
}

// TestAgent_TrainerBackAfterCommitResumesIt: sidecar mode (no command):
// the trainer container commits step 7, its connection closes (the
// kubelet restarts it in place) while the agent runs on; its new hello
// (protocol 1) is welcomed with step 7, restored into the agent's restore
// area, never with the start's resume (none: a fresh start).
func TestAgent_TrainerBackAfterCommitResumesIt(t *testing.T) {
	ar := startAgent(t, nil)
	tr := trainertest.Dial(t, ar.cfg.Server.Path)
	if w := tr.Hello(); w.Resume != nil {
		t.Fatalf("first welcome resumes %+v", w.Resume)
	}
	commitOwn(t, ar, tr, "mine", 7)
	tr.Close()
	w := trainertest.Dial(t, ar.cfg.Server.Path).Hello()
	checkResume(t, ar, w.Resume, 7, "mine")
}

// TestAgent_TrainerBackAfterCommitWaitsForRestore: a protocol 2 trainer
// back after a commit is welcomed at once with restore "pending", then
// told restored {step 8}; the one after it, while no commit came in
// between and a trainer of its group is connected, is welcomed with the
// same checkpoint at once; a later commit (step 9) is what the next one
// back resumes.
func TestAgent_TrainerBackAfterCommitWaitsForRestore(t *testing.T) {
	ar := startAgent(t, nil)
	a, b := trainertest.Dial(t, ar.cfg.Server.Path), trainertest.Dial(t, ar.cfg.Server.Path)
	a.Hello()
	b.Hello()
	commitOwn(t, ar, a, "eight", 8)
	a.Close()
	a2 := trainertest.Dial(t, ar.cfg.Server.Path)
	a2.Send(map[string]any{"type": "hello", "pid": os.Getpid(), "version": 2})
	if w := a2.Expect(protocol.TypeWelcome); w.Restore != protocol.RestorePending || w.Resume != nil {
		t.Fatalf("welcome %+v, want restore pending and no resume yet", w)
	}
	r := a2.Expect(protocol.TypeRestored).Resume
	checkResume(t, ar, r, 8, "eight")
	b.Close()
	b2 := trainertest.Dial(t, ar.cfg.Server.Path)
	b2.Send(map[string]any{"type": "hello", "pid": os.Getpid(), "version": 2})
	w := b2.Expect(protocol.TypeWelcome)
	if w.Restore == protocol.RestorePending || w.Resume == nil || w.Resume.Dir != r.Dir || w.Resume.ID != r.ID {
		t.Fatalf("the second rank back is welcomed with %+v (restore %q), want %+v at once: ranks of one restart resume the same checkpoint", w.Resume, w.Restore, r)
	}
	commitOwn(t, ar, a2, "nine", 9)
	a2.Close()
	a3 := trainertest.Dial(t, ar.cfg.Server.Path)
	a3.Send(map[string]any{"type": "hello", "pid": os.Getpid(), "version": 2})
	if w := a3.Expect(protocol.TypeWelcome); w.Restore != protocol.RestorePending || w.Resume != nil {
		t.Fatalf("welcome %+v, want restore pending and no resume: never the older step 8 meanwhile", w)
	}
	checkResume(t, ar, a3.Expect(protocol.TypeRestored).Resume, 9, "nine")
	if _, err := os.Stat(r.Dir); !os.IsNotExist(err) {
		t.Fatalf("the older restore %s is still there (%v): restores must not pile up", r.Dir, err)
	}
}

// heldStore holds the Gets (or, with puts, the Puts) of w.pt once armed,
// until its gate is closed.
type heldStore struct {
	cloud.Store
	mu      sync.Mutex
	armed   bool
	puts    bool
	waiting int
	gate    chan struct{}
}

func (h *heldStore) Put(ctx context.Context, key string, r io.Reader, size int64, opts cloud.PutOptions) error {
	h.mu.Lock()
	gate := h.gate
	hold := h.armed && h.puts && strings.HasSuffix(key, "w.pt")
	if hold {
		h.waiting++
	}
	h.mu.Unlock()
	if hold {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return h.Store.Put(ctx, key, r, size, opts)
}

func (h *heldStore) arm() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.armed, h.gate = true, make(chan struct{})
}

func (h *heldStore) held() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.waiting
}

func (h *heldStore) Get(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	h.mu.Lock()
	gate := h.gate
	hold := h.armed && !h.puts && strings.HasSuffix(key, "w.pt")
	if hold {
		h.waiting++
	}
	h.mu.Unlock()
	if hold {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return h.Store.Get(ctx, key, off, n)
}

// TestAgent_HellosDuringRejoinRestoreGetItsResult: while the restore for a
// trainer back after a commit runs (its store reads held), a protocol 1
// hello is not welcomed; both learn the restored step 5 once it is in
// place, and only one restore ran (one read of w.pt was held).
func TestAgent_HellosDuringRejoinRestoreGetItsResult(t *testing.T) {
	var hs *heldStore
	ar := startAgent(t, func(c *Config) { hs = &heldStore{Store: c.Store}; c.Store = hs })
	tr := trainertest.Dial(t, ar.cfg.Server.Path)
	tr.Hello()
	commitOwn(t, ar, tr, "five", 5)
	hs.arm()
	tr.Close()
	p2 := trainertest.Dial(t, ar.cfg.Server.Path)
	p2.Send(map[string]any{"type": "hello", "pid": os.Getpid(), "version": 2})
	if w := p2.Expect(protocol.TypeWelcome); w.Restore != protocol.RestorePending {
		t.Fatalf("welcome %+v, want restore pending", w)
	}
	testutil.WaitFor(t, "the restore's read of w.pt", func() bool { return hs.held() == 1 })
	p1 := trainertest.Dial(t, ar.cfg.Server.Path)
	p1.Send(map[string]any{"type": "hello", "pid": os.Getpid()})
	select {
	case m := <-p1.Msgs():
		t.Fatalf("a protocol 1 hello is answered %+v while the restore runs", m)
	default:
	}
	close(hs.gate)
	checkResume(t, ar, p2.Expect(protocol.TypeRestored).Resume, 5, "five")
	checkResume(t, ar, p1.Expect(protocol.TypeWelcome).Resume, 5, "five")
	if n := hs.held(); n != 1 {
		t.Fatalf("%d reads of w.pt were held, want 1: one restore for the hellos that came while it ran", n)
	}
}

// TestAgent_NoticeDuringRejoinRestoreSaysWhy: a notice while the trainer
// back after a commit waits on its restore asks nothing (no trainer has
// resumed: nothing worth saving), and the log says that a restore runs,
// with the trainers connected, not "no trainer connected" (agent
// simulation, seed 143).
func TestAgent_NoticeDuringRejoinRestoreSaysWhy(t *testing.T) {
	var hs *heldStore
	src := noticetest.New(1)
	core, logs := observer.New(zap.InfoLevel)
	ar := startAgent(t, func(c *Config) {
		hs = &heldStore{Store: c.Store}
		c.Store, c.Source, c.Log = hs, src, zap.New(core)
	})
	tr := trainertest.Dial(t, ar.cfg.Server.Path)
	tr.Hello()
	commitOwn(t, ar, tr, "five", 5)
	hs.arm()
	t.Cleanup(func() { close(hs.gate) })
	tr.Close()
	back := trainertest.Dial(t, ar.cfg.Server.Path)
	back.Send(map[string]any{"type": "hello", "pid": os.Getpid(), "version": 2})
	if w := back.Expect(protocol.TypeWelcome); w.Restore != protocol.RestorePending {
		t.Fatalf("welcome %+v, want restore pending", w)
	}
	testutil.WaitFor(t, "the restore's read of w.pt", func() bool { return hs.held() == 1 })
	now := time.Now()
	src.C <- metadata.Notice{Cloud: metadata.CloudAWS, Kind: metadata.KindTermination, ID: "n1", Detected: now, Deadline: now.Add(time.Minute)}
	const want = "a restore runs: no trainer has resumed: nothing to checkpoint before the deadline"
	testutil.WaitFor(t, "the stop's warning", func() bool { return logs.FilterMessage(want).Len() > 0 })
	// The trainer back, and maybe the first one still: its close reaches
	// the agent on its own time.
	if e := logs.FilterMessage(want).All()[0]; e.ContextMap()["connected"].(int64) < 1 {
		t.Fatalf("warning %v, want connected 1 or more (the trainer back)", e.ContextMap())
	}
	if n := logs.FilterMessageSnippet("no trainer connected").Len(); n != 0 {
		t.Fatalf("%d 'no trainer connected' lines while a trainer waited on its restore", n)
	}
	if _, ok := back.Next(protocol.TypeCheckpoint, 100*time.Millisecond); ok {
		t.Fatal("a checkpoint was asked of a trainer that has not resumed")
	}
}

// TestAgent_TrainerBackAfterCommitRestoreFails: the restore for a trainer
// back after a commit fails (the committed file is gone from the store):
// the trainer is told restore_failed, never handed the older resume; the
// agent runs on.
func TestAgent_TrainerBackAfterCommitRestoreFails(t *testing.T) {
	ar := startAgent(t, nil)
	tr := trainertest.Dial(t, ar.cfg.Server.Path)
	tr.Hello()
	commitOwn(t, ar, tr, "six", 6)
	tr.Close()
	var gone []string
	err := filepath.Walk(filepath.Join(filepath.Dir(ar.cfg.CheckpointDir), "store"), func(p string, fi os.FileInfo, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			// A store write's temporary file, renamed into place between
			// the listing and its lstat: the commit's journal write, in
			// flight beside the walk (it failed a full make test).
			return nil
		}
		if err == nil && fi.Name() == "w.pt" {
			gone = append(gone, p)
		}
		return err
	})
	if err != nil || len(gone) == 0 {
		t.Fatalf("no w.pt in the store (%v)", err)
	}
	for _, p := range gone {
		os.Remove(p)
	}
	p2 := trainertest.Dial(t, ar.cfg.Server.Path)
	p2.Send(map[string]any{"type": "hello", "pid": os.Getpid(), "version": 2})
	if w := p2.Expect(protocol.TypeWelcome); w.Restore != protocol.RestorePending {
		t.Fatalf("welcome %+v, want restore pending", w)
	}
	if f := p2.Expect(protocol.TypeRestoreFailed); f.Error == "" {
		t.Fatalf("restore_failed %+v without an error", f)
	}
	select {
	case code := <-ar.done:
		t.Fatalf("the agent exited %d after a trainer's failed restore", code)
	default:
	}
}

// TestAgent_TrainerBackDuringUploadResumesIt: the trainer sends done for
// step 4 and crashes while its upload runs (held); the trainer back
// meanwhile is told restore "pending", not handed the start's resume (a
// fresh start); once step 4 committed it is restored for it.
func TestAgent_TrainerBackDuringUploadResumesIt(t *testing.T) {
	var hs *heldStore
	ar := startAgent(t, func(c *Config) { hs = &heldStore{Store: c.Store, puts: true}; c.Store = hs })
	tr := trainertest.Dial(t, ar.cfg.Server.Path)
	tr.Hello()
	hs.arm()
	own := filepath.Join(ar.cfg.CheckpointDir, "four")
	testutil.WriteFile(t, filepath.Join(own, "w.pt"), "step four")
	tr.Send(map[string]any{"type": "done", "step": 4, "dir": own, "pid": os.Getpid()})
	testutil.WaitFor(t, "the upload of w.pt", func() bool { return hs.held() == 1 })
	tr.Close()
	p2 := trainertest.Dial(t, ar.cfg.Server.Path)
	p2.Send(map[string]any{"type": "hello", "pid": os.Getpid(), "version": 2})
	if w := p2.Expect(protocol.TypeWelcome); w.Restore != protocol.RestorePending || w.Resume != nil {
		t.Fatalf("welcome %+v during the upload of step 4, want restore pending", w)
	}
	close(hs.gate)
	if c := p2.Expect(protocol.TypeCommitted); c.Step == nil || *c.Step != 4 {
		t.Fatalf("committed %+v, want step 4", c)
	}
	checkResume(t, ar, p2.Expect(protocol.TypeRestored).Resume, 4, "four")
}

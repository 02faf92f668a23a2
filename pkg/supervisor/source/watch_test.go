package source

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/cloud/file"
	"github.com/spotagent/spotagent/pkg/watch"
)

func TestParseNoticeSignal(t *testing.T) {
	for in, want := range map[string]syscall.Signal{"SIGTERM": syscall.SIGTERM, "term": syscall.SIGTERM, "INT": syscall.SIGINT,
		"sigusr1": syscall.SIGUSR1, "USR2": syscall.SIGUSR2} {
		if got, err := ParseNoticeSignal(in); err != nil || got != want {
			t.Errorf("ParseNoticeSignal(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "KILL", "SIGHUP", "15"} {
		if _, err := ParseNoticeSignal(in); err == nil || !strings.Contains(err.Error(), "SIGUSR1") {
			t.Errorf("ParseNoticeSignal(%q): error %v, want one naming the signals allowed", in, err)
		}
	}
}

// host is the agent as a source sees it; only what a test calls is
// answered (the rest panics: the Watch must not call it there).
type host struct {
	Host
	step int64
}

func (h *host) State() State { return State{TrainerStep: h.step} }

func env(t *testing.T, dir, scratch string) Env {
	t.Helper()
	st, err := file.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return Env{Watch: &WatchConfig{Config: watch.Config{Dir: dir, Quiet: time.Second}}, HasCommand: true, CheckpointDir: scratch,
		Store: st, Keep: 3, Log: zap.NewNop(), Started: time.Now()}
}

func TestNewWatch_RefusesWhatCannotWork(t *testing.T) {
	base := t.TempDir()
	dir, scratch := filepath.Join(base, "out"), filepath.Join(base, "scratch")
	for _, d := range []string{dir, scratch} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name string
		set  func(*Env)
		word string
	}{
		{"WithSignal", func(e *Env) { e.Signal = syscall.SIGUSR1 }, "--signal"},
		{"NoticeSignalWithoutCommand", func(e *Env) { e.HasCommand = false; e.Watch.NoticeSignal = syscall.SIGUSR1 }, "--notice-signal"},
		{"InsideTheCheckpointDir", func(e *Env) { e.Watch.Dir = filepath.Join(scratch, "x") }, "--checkpoint-dir"},
		{"HoldingTheCheckpointDir", func(e *Env) { e.CheckpointDir = filepath.Join(dir, "scratch") }, "--checkpoint-dir"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := env(t, dir, scratch)
			tc.set(&e)
			if _, err := NewWatch(&host{}, e); err == nil || !strings.Contains(err.Error(), tc.word) {
				t.Fatalf("NewWatch: %v, want an error naming %s", err, tc.word)
			}
		})
	}
}

// TestNewWatch_EmptiesTheStage: what a crashed agent staged in DIR is of
// no further use; the trainer's own files are left alone.
func TestNewWatch_EmptiesTheStage(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "out")
	if err := os.MkdirAll(filepath.Join(dir, watchStage, "old"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "trainer.txt"), []byte("mine"), 0o600); err != nil {
		t.Fatal(err)
	}
	ws, err := NewWatch(&host{step: 7}, env(t, dir, filepath.Join(base, "scratch")))
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	if _, err := os.Stat(filepath.Join(dir, watchStage, "old")); !os.IsNotExist(err) {
		t.Fatalf("the old stage's leftovers are still there (%v)", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "trainer.txt")); err != nil {
		t.Fatalf("the trainer's file is gone: %v", err)
	}
	if ws.Asks() {
		t.Fatal("zero-code mode asks the trainer for checkpoints")
	}
	// Nothing in DIR yet: the trainer's own report is the step reached.
	if v := ws.View(time.Now()); v.Reached != 7 || v.ReachedFrom != "" {
		t.Fatalf("reached %d (%q), want the trainer's 7", v.Reached, v.ReachedFrom)
	}
	ws.host.(*host).step = 0
	if v := ws.View(time.Now()); v.Reached != 0 || v.ReachedFrom != journal.LostFromDir {
		t.Fatalf("reached %d (%q), want 0 from DIR", v.Reached, v.ReachedFrom)
	}
}

// stopHost is a host that records the stops it is told of.
type stopHost struct {
	host
	committed []int64 // StopCommitted's steps
}

func (h *stopHost) StopCommitted(_ Stop, res *commit.Result, _ time.Time) {
	h.committed = append(h.committed, res.Manifest.Step)
}

// endedStop is an interruption whose record was made.
type endedStop struct {
	Stop
	id   string
	step int64
}

func (s *endedStop) Finished() bool { return true }
func (s *endedStop) Checkpointed(id string, step int64, _ float64, _ time.Time) {
	s.id, s.step = id, step
}

// TestWatch_NewerCommitAfterTheStopAmendsIt: a checkpoint complete just
// before the stop but committed after its record was made (step 110 then,
// 120 now) makes the record name it; an older one that commits late
// changes nothing.
func TestWatch_NewerCommitAfterTheStopAmendsIt(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "out")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	h := &stopHost{}
	ws, err := NewWatch(h, env(t, dir, filepath.Join(base, "scratch")))
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	s := &endedStop{id: "c110", step: 110}
	ended := time.Now()
	ws.intr = &watchStop{s: s, ended: ended, recorded: 110}
	for _, c := range []struct {
		id      string
		step    int64
		written time.Time
	}{{"c120", 120, ended.Add(-time.Second)}, {"c100", 100, ended.Add(-time.Minute)}, {"c130", 130, ended.Add(time.Minute)}} {
		cp := writtenAt(t, ws, dir, c.step, c.written)
		ws.inflight[c.id] = &watchUpload{cp: cp, unexpect: func() {}, started: time.Now()}
		ws.Committed(Result{ID: c.id, Res: &commit.Result{Manifest: &checkpoint.Manifest{ID: c.id, Step: c.step}}})
	}
	if s.id != "c120" || s.step != 120 || len(h.committed) != 1 || h.committed[0] != 120 {
		t.Fatalf("record %s at %d, stops committed %v: want c120 at 120, told once (not c130, written after the stop)", s.id, s.step, h.committed)
	}
}

// writtenAt makes DIR/checkpoint-<step>, its files and itself last written
// at when, and returns it as the watcher finds it complete.
func writtenAt(t *testing.T, ws *Watch, dir string, step int64, when time.Time) *watch.Checkpoint {
	t.Helper()
	name := fmt.Sprintf("checkpoint-%d", step)
	p := filepath.Join(dir, name)
	if err := os.Mkdir(p, 0o700); err != nil {
		t.Fatal(err)
	}
	files := []string{filepath.Join(p, "model.bin"), filepath.Join(p, watch.HFMarker), p}
	for _, f := range files[:2] {
		if err := os.WriteFile(f, []byte(name), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range files {
		if err := os.Chtimes(f, when, when); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	for _, at := range []time.Time{now, now.Add(time.Hour)} { // seen, then quiet
		for _, cp := range ws.w.Scan(at) {
			if cp.Name == name {
				return cp
			}
		}
	}
	t.Fatalf("%s never complete", name)
	return nil
}

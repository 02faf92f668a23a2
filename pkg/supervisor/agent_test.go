package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/internal/testutil/noticetest"
	"github.com/spotagent/spotagent/internal/testutil/trainertest"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/file"
	"github.com/spotagent/spotagent/pkg/fleet"
	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/schedule"
)

// waitStatus asks the agent for its status over a connection of its own
// until cond holds, failing the test at testutil.Wait.
func (ar *agentRun) waitStatus(t *testing.T, what string, cond func(Status) bool) {
	t.Helper()
	tr := trainertest.Dial(t, ar.cfg.Server.Path)
	deadline := time.Now().Add(testutil.Wait)
	for {
		tr.Send(map[string]any{"type": "status"})
		var s Status
		if err := json.Unmarshal(tr.Expect(protocol.TypeStatus).Status, &s); err != nil {
			t.Fatalf("status: %v", err)
		}
		if cond(s) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: status %+v", what, s)
		}
		time.Sleep(5 * time.Millisecond) // polling a condition, bounded by deadline
	}
}

type agentRun struct {
	cfg   Config
	sigs  chan os.Signal
	done  chan int
	err   error // Run's, set before done gets its code
	store *file.Store
}

func startAgent(t *testing.T, mutate func(*Config)) *agentRun {
	t.Helper()
	return startAgentErr(t, mutate, false)
}

// startAgentErr is startAgent; with allowErr, Run may return an error
// (a failed restore while the trainer starts).
func startAgentErr(t *testing.T, mutate func(*Config), allowErr bool) *agentRun {
	t.Helper()
	dir := testutil.ShortDir(t)
	st, err := file.New(filepath.Join(dir, "store"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		RunID: "test", CheckpointDir: filepath.Join(dir, "ckpt"), Store: st,
		Server:    protocol.ServerConfig{Path: filepath.Join(dir, "a.sock")},
		Scheduler: schedule.NewScheduler(schedule.SchedulerConfig{Fixed: time.Hour}),
		TermGrace: 5 * time.Second, KillAfter: time.Second, Log: zap.NewNop(),
		SignalWindow: -1, // tests send their second signal at once; TestAgent_SignalsWithinWindowAreOne turns it on
	}
	if mutate != nil {
		mutate(&cfg)
	}
	ar := &agentRun{cfg: cfg, sigs: make(chan os.Signal, 2), done: make(chan int, 1), store: st}
	go func() {
		code, err := Run(context.Background(), cfg, ar.sigs)
		if err != nil && !allowErr {
			t.Errorf("Run: %v", err)
		}
		ar.err = err
		ar.done <- code
	}()
	t.Cleanup(func() {
		select {
		case <-ar.done:
		default:
			ar.sigs <- syscall.SIGTERM
			ar.sigs <- syscall.SIGTERM
			<-ar.done
		}
	})
	return ar
}

func (ar *agentRun) wait(t *testing.T) int {
	t.Helper()
	select {
	case code := <-ar.done:
		ar.done <- code
		return code
	case <-time.After(testutil.Wait):
		t.Fatal("agent did not exit")
	}
	return -1
}

func latestStep(t *testing.T, ar *agentRun) int64 {
	t.Helper()
	l, err := checkpoint.ReadLatest(context.Background(), ar.store)
	if err != nil {
		t.Fatalf("latest: %v", err)
	}
	return l.Step
}

func TestAgent_ShutdownCheckpoint(t *testing.T) {
	ar := startAgent(t, nil)
	tr := trainertest.Dial(t, ar.cfg.Server.Path)
	if w := tr.Hello(); w.RunID != "test" || w.Resume != nil || w.CheckpointDir != ar.cfg.CheckpointDir {
		t.Fatalf("welcome=%+v", w)
	}
	ar.sigs <- syscall.SIGTERM
	req := tr.Expect(protocol.TypeCheckpoint)
	if req.Reason != protocol.ReasonShutdown || req.Deadline == nil || !strings.HasPrefix(req.Dir, ar.cfg.CheckpointDir) {
		t.Fatalf("checkpoint request=%+v", req)
	}
	tr.Save(req, 42, "weights")
	if c := tr.Expect(protocol.TypeCommitted); c.ID != req.ID || !strings.Contains(c.URI, "000000000042-"+req.ID) {
		t.Fatalf("committed=%+v", c)
	}
	if s := tr.Expect(protocol.TypeStop); s.Reason != protocol.ReasonShutdown {
		t.Fatalf("stop=%+v", s)
	}
	if code := ar.wait(t); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	if got := latestStep(t, ar); got != 42 {
		t.Fatalf("latest step=%d, want 42", got)
	}
	// The next agent on the same store resumes from it.
	ar2 := startAgent(t, func(c *Config) { c.Store = ar.store })
	w := trainertest.Dial(t, ar2.cfg.Server.Path).Hello()
	if w.Resume == nil || w.Resume.Step != 42 {
		t.Fatalf("second welcome resume=%+v, want step 42", w.Resume)
	}
	b, err := os.ReadFile(filepath.Join(w.Resume.Dir, "state.bin"))
	if err != nil || string(b) != "weights" {
		t.Fatalf("restored file=%q err=%v", b, err)
	}
}

func TestAgent_Periodic(t *testing.T) {
	ar := startAgent(t, func(c *Config) {
		c.Scheduler = schedule.NewScheduler(schedule.SchedulerConfig{Fixed: 50 * time.Millisecond})
	})
	tr := trainertest.Dial(t, ar.cfg.Server.Path)
	tr.Hello()
	for step := int64(1); step <= 3; step++ {
		req := tr.Expect(protocol.TypeCheckpoint)
		if req.Reason != protocol.ReasonPeriodic {
			t.Fatalf("reason=%s", req.Reason)
		}
		tr.Save(req, step*10, "w")
		tr.Expect(protocol.TypeCommitted)
	}
	if got := latestStep(t, ar); got != 30 {
		t.Fatalf("latest step=%d, want 30", got)
	}
}

func TestAgent_BadMessages(t *testing.T) {
	ar := startAgent(t, nil)
	tr := trainertest.Dial(t, ar.cfg.Server.Path)
	tr.Hello()
	tr.Send(map[string]any{"type": "done", "id": "nope", "step": 1})
	if e := tr.Expect(protocol.TypeError); !strings.Contains(e.Error, "unknown checkpoint id") {
		t.Fatalf("error=%q", e.Error)
	}
	tr.Send(map[string]any{"type": "done", "step": 1, "dir": "/etc"})
	if e := tr.Expect(protocol.TypeError); !strings.Contains(e.Error, "not inside the checkpoint directory") {
		t.Fatalf("error=%q", e.Error)
	}
	tr.Send(map[string]any{"type": "done", "step": 1, "dir": ar.cfg.CheckpointDir + "/../../etc"})
	tr.Expect(protocol.TypeError)
	tr.Send(map[string]any{"type": "done", "id": "x"})
	if e := tr.Expect(protocol.TypeError); !strings.Contains(e.Error, "step") {
		t.Fatalf("error=%q", e.Error)
	}
	// Still serving: an unsolicited checkpoint inside the directory commits.
	own := filepath.Join(ar.cfg.CheckpointDir, "mine")
	os.MkdirAll(own, 0o700)
	os.WriteFile(filepath.Join(own, "w"), []byte("x"), 0o600)
	tr.Send(map[string]any{"type": "done", "step": 7, "dir": own})
	if c := tr.Expect(protocol.TypeCommitted); c.Step == nil || *c.Step != 7 {
		t.Fatalf("committed=%+v", c)
	}
}

// TestAgent_TrainerMissesDeadline: a trainer too slow for a termination
// notice's deadline (here: one that never answers) is not waited for: it
// is stopped at the deadline, the checkpoint it took before stays the
// newest, the failure is logged, and the journal records the interruption
// (its cloud and the request's id) as not committed, why, and the work
// lost: what `spotagent history` shows (render TestHistory_Rows). (The
// end-to-end TestNotice_TrainerTooSlow was cut in #49.)
func TestAgent_TrainerMissesDeadline(t *testing.T) {
	src := noticetest.New(1)
	core, logs := observer.New(zap.InfoLevel)
	ar := startAgent(t, func(c *Config) {
		c.Source = src
		c.Command = []string{"/bin/sh", "-c", "sleep 60"}
		c.Margin = 100 * time.Millisecond
		c.Log = zap.New(core)
	})
	tr := trainertest.Dial(t, ar.cfg.Server.Path)
	tr.Hello()
	// A committed checkpoint first: the one that must stand.
	tr.Send(map[string]any{"type": "done", "step": 5, "dir": mkCheckpoint(t, ar.cfg.CheckpointDir, "first")})
	tr.Expect(protocol.TypeCommitted)
	now := time.Now()
	src.C <- metadata.Notice{Cloud: metadata.CloudAWS, Kind: metadata.KindTermination, ID: "n1", Detected: now, Deadline: now.Add(time.Second)}
	req := tr.Expect(protocol.TypeCheckpoint)
	if req.Reason != protocol.ReasonInterruption || !req.Deadline.Before(now.Add(time.Second)) {
		t.Fatalf("request=%+v", req)
	}
	// The trainer never answers: stop comes anyway, the child is killed at
	// the deadline, and the run is one to continue elsewhere.
	tr.Expect(protocol.TypeStop)
	if code := ar.wait(t); code != ExitInterrupted {
		t.Fatalf("exit code=%d, want %d (killed at the stop deadline)", code, ExitInterrupted)
	}
	if got := latestStep(t, ar); got != 5 {
		t.Fatalf("latest step=%d, want 5 (the previous checkpoint stands)", got)
	}
	j, err := journal.Read(context.Background(), ar.store, "test")
	if err != nil || len(j.Interruptions) != 1 || j.Interruptions[0].CommitOK || j.Interruptions[0].LostSeconds <= 0 {
		t.Fatalf("journal interruptions=%+v err=%v", j.Interruptions, err)
	}
	if in := j.Interruptions[0]; in.Committed != nil || in.CheckpointID != req.ID || in.Cloud != string(metadata.CloudAWS) ||
		!strings.Contains(in.Error, "missed the deadline") {
		t.Fatalf("journal interruption=%+v, want request %s of aws, not committed, its error saying the deadline was missed", in, req.ID)
	}
	if es := logs.FilterMessage("interruption checkpoint did not commit: the previous checkpoint stands").All(); len(es) != 1 ||
		es[0].ContextMap()["committed_step"] != int64(5) {
		t.Fatalf("want one 'interruption checkpoint did not commit: the previous checkpoint stands' at step 5, got %v", es)
	}
}

// TestAgent_AnswersLate: the trainer saves its shutdown checkpoint but
// says done only after the deadline (once stop came). The late done is
// refused (an error reply with its id: unknown checkpoint id; logged), the
// failed stop is logged, nothing of that checkpoint reaches the store, the
// previous checkpoint stands, and the trainer's own exit after the stop
// makes the agent exit ExitInterrupted. (The end-to-end
// TestHostile_AnswersLate, with the Python fake trainer, was cut in #49.)
func TestAgent_AnswersLate(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	release := filepath.Join(testutil.ShortDir(t), "release")
	ar := startAgent(t, func(c *Config) {
		c.Command = []string{"/bin/sh", "-c", "while [ ! -f " + release + " ]; do sleep 0.02; done"}
		c.TermGrace, c.Margin = 2*time.Second, time.Second
		c.KillAfter = time.Hour // the trainer must leave on its own
		c.Log = zap.New(core)
	})
	tr := trainertest.Dial(t, ar.cfg.Server.Path)
	tr.Hello()
	tr.Send(map[string]any{"type": "done", "step": 5, "dir": mkCheckpoint(t, ar.cfg.CheckpointDir, "first")})
	tr.Expect(protocol.TypeCommitted)
	ar.sigs <- syscall.SIGTERM
	req := tr.Expect(protocol.TypeCheckpoint)
	if req.Reason != protocol.ReasonShutdown {
		t.Fatalf("request=%+v, want reason shutdown", req)
	}
	// Saved in time, said done too late: after the stop.
	os.WriteFile(filepath.Join(req.Dir, "state.bin"), []byte("late"), 0o600)
	tr.Expect(protocol.TypeStop)
	tr.Send(map[string]any{"type": "done", "id": req.ID, "step": 9})
	if e := tr.Expect(protocol.TypeError); e.ID != req.ID || !strings.Contains(e.Error, "unknown checkpoint id") {
		t.Fatalf("reply to the late done=%+v, want an error for id %s: unknown checkpoint id", e, req.ID)
	}
	os.WriteFile(release, nil, 0o600)
	if code := ar.wait(t); code != ExitInterrupted {
		t.Fatalf("exit code=%d, want %d (the trainer stopped on its own after the shutdown)", code, ExitInterrupted)
	}
	if got := latestStep(t, ar); got != 5 {
		t.Fatalf("latest step=%d, want 5 (the previous checkpoint stands)", got)
	}
	ar.store.List(context.Background(), "", func(o cloud.ObjectInfo) error {
		if strings.Contains(o.Key, req.ID) {
			t.Errorf("object %s of the late checkpoint reached the store", o.Key)
		}
		return nil
	})
	for _, w := range []struct{ msg, id string }{
		{"trainer missed the checkpoint deadline", req.ID},
		{"interruption checkpoint did not commit: the previous checkpoint stands", ""},
		{"done for an unknown checkpoint id", req.ID},
	} {
		es := logs.FilterMessage(w.msg).All()
		if len(es) != 1 || (w.id != "" && es[0].ContextMap()["id"] != w.id) {
			t.Fatalf("log %q: %v, want one entry (id %q)", w.msg, es, w.id)
		}
	}
	if r := logs.FilterMessage("trainer missed the checkpoint deadline").All()[0].ContextMap()["reason"]; r != protocol.ReasonShutdown {
		t.Fatalf("missed deadline logged with reason %v, want shutdown", r)
	}
}

func mkCheckpoint(t *testing.T, root, name string) string {
	dir := filepath.Join(root, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "w"), []byte(name), 0o600)
	return dir
}

func TestAgent_PendingPeriodicBecomesInterruption(t *testing.T) {
	src := noticetest.New(1)
	ar := startAgent(t, func(c *Config) {
		c.Source = src
		c.Scheduler = schedule.NewScheduler(schedule.SchedulerConfig{Fixed: 10 * time.Millisecond})
	})
	tr := trainertest.Dial(t, ar.cfg.Server.Path)
	tr.Hello()
	req := tr.Expect(protocol.TypeCheckpoint) // periodic, not answered yet
	now := time.Now()
	src.C <- metadata.Notice{Cloud: metadata.CloudAWS, Kind: metadata.KindTermination, ID: "n1", Detected: now, Deadline: now.Add(time.Minute)}
	// The notice and the done race inside the agent: answer only once the
	// agent has taken the notice in, or the periodic commit comes first.
	ar.waitStatus(t, "the notice taken in", func(s Status) bool { return s.Stopping != "" })
	// No second request: answering the pending one commits the interruption checkpoint.
	tr.Save(req, 9, "w")
	if c := tr.Expect(protocol.TypeCommitted); c.ID != req.ID {
		t.Fatalf("committed=%+v, want id %s", c, req.ID)
	}
	if s := tr.Expect(protocol.TypeStop); s.Reason != protocol.ReasonInterruption {
		t.Fatalf("stop=%+v", s)
	}
	m, err := checkpoint.ReadManifest(context.Background(), ar.store, checkpoint.ManifestKey(9, req.ID))
	if err != nil || m.Reason != protocol.ReasonInterruption {
		t.Fatalf("manifest=%+v err=%v, want reason interruption", m, err)
	}
}

func TestAgent_MaxRestarts(t *testing.T) {
	marker := filepath.Join(testutil.ShortDir(t), "failed-once")
	ar := startAgent(t, func(c *Config) {
		c.MaxRestarts = 1
		// Fails on its own the first time, succeeds the second time; the
		// restart gets the same environment.
		c.Command = []string{"/bin/sh", "-c", `test -n "$SPOTAGENT_SOCKET" || exit 9; if [ -f ` + marker + ` ]; then exit 0; fi; touch ` + marker + `; exit 3`}
	})
	if code := ar.wait(t); code != 0 {
		t.Fatalf("exit code %d, want 0 after one restart", code)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatalf("the first attempt did not run: %v", err)
	}
}

func TestAgent_NoRestartsLeft(t *testing.T) {
	ar := startAgent(t, func(c *Config) { c.Command = []string{"/bin/sh", "-c", "exit 3"} })
	if code := ar.wait(t); code != 3 {
		t.Fatalf("exit code %d, want the child's 3", code)
	}
}

// TestAgent_CrashMidSave: the trainer dies half-way through writing a
// periodic checkpoint: its connection drops and its process exits 3, in
// either order. The agent exits with the trainer's 3 (logged in `trainer
// exited`), the checkpoint is abandoned (logged), nothing of it reaches
// the store, the previous checkpoint stands, and the half-written
// directory is removed: a restarted trainer, or the next run, would find
// it. (The end-to-end TestHostile_CrashMidSave was cut in #49.)
func TestAgent_CrashMidSave(t *testing.T) {
	for _, tc := range []struct {
		name      string
		childGoes bool   // the process exits before the connection drops
		abandoned string // the log line of the abandon
	}{
		{"process exits first", true, "checkpoint abandoned: the trainer exited before answering"},
		{"connection drops first", false, "checkpoint abandoned: every trainer disconnected"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			core, logs := observer.New(zap.InfoLevel)
			release := filepath.Join(testutil.ShortDir(t), "release")
			ar := startAgent(t, func(c *Config) {
				c.Command = []string{"/bin/sh", "-c", "while [ ! -f " + release + " ]; do sleep 0.02; done; exit 3"}
				c.Scheduler = schedule.NewScheduler(schedule.SchedulerConfig{Fixed: 50 * time.Millisecond})
				c.Log = zap.New(core)
			})
			tr := trainertest.Dial(t, ar.cfg.Server.Path)
			tr.Hello()
			tr.Save(tr.Expect(protocol.TypeCheckpoint), 10, "w")
			tr.Expect(protocol.TypeCommitted)
			req := tr.Expect(protocol.TypeCheckpoint)
			testutil.WriteFile(t, filepath.Join(req.Dir, "state.bin"), strings.Repeat("x", 512)) // half of it
			abandoned := func() bool { return logs.FilterMessage(tc.abandoned).FilterField(zap.String("id", req.ID)).Len() == 1 }
			if tc.childGoes {
				os.WriteFile(release, nil, 0o600)
				testutil.WaitFor(t, tc.abandoned, abandoned)
				tr.Close()
			} else {
				tr.Close()
				testutil.WaitFor(t, tc.abandoned, abandoned)
				os.WriteFile(release, nil, 0o600)
			}
			if code := ar.wait(t); code != 3 {
				t.Fatalf("exit code %d, want the trainer's 3", code)
			}
			if es := logs.FilterMessage("trainer exited").All(); len(es) != 1 || es[0].ContextMap()["code"] != int64(3) {
				t.Fatalf("trainer exited logged %v, want once with code 3", es)
			}
			if _, err := os.Stat(req.Dir); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("half-written checkpoint directory %s left behind (stat: %v)", req.Dir, err)
			}
			if got := latestStep(t, ar); got != 10 {
				t.Fatalf("latest step=%d, want 10 (the previous checkpoint stands)", got)
			}
			if ms, err := checkpoint.ListManifests(context.Background(), ar.store); err != nil || len(ms) != 1 {
				t.Fatalf("manifests %v (%v), want the first checkpoint's alone", ms, err)
			}
			ar.store.List(context.Background(), "", func(o cloud.ObjectInfo) error {
				if strings.Contains(o.Key, req.ID) {
					t.Errorf("object %s of the crashed checkpoint reached the store", o.Key)
				}
				return nil
			})
		})
	}
}

func TestAgent_SecondSignalStopsAtOnce(t *testing.T) {
	ar := startAgent(t, func(c *Config) {
		c.Command = []string{"/bin/sh", "-c", "sleep 60"}
		c.TermGrace = time.Hour // only the second signal can end this quickly
	})
	tr := trainertest.Dial(t, ar.cfg.Server.Path)
	tr.Hello()
	ar.sigs <- syscall.SIGTERM
	tr.Expect(protocol.TypeCheckpoint) // never answered
	ar.sigs <- syscall.SIGTERM
	if code := ar.wait(t); code != 128+int(syscall.SIGTERM) {
		t.Fatalf("exit code %d, want %d", code, 128+int(syscall.SIGTERM))
	}
}

// TestAgent_ExitCodeAfterStop: after an interruption, a trainer that exits
// 0 or 75 makes the agent exit ExitInterrupted; a trainer that crashes with
// another code keeps it; without a notice the trainer's 0 stays 0.
func TestAgent_ExitCodeAfterStop(t *testing.T) {
	for _, tc := range []struct {
		name   string
		notice bool
		exit   int
		want   int
	}{
		{"clean exit after notice", true, 0, ExitInterrupted},
		{"client's 75 after notice", true, 75, ExitInterrupted},
		{"crash after notice", true, 3, 3},
		{"torchrun's 1 after the committed stop", true, 1, ExitInterrupted},
		{"1 without a notice", false, 1, 1},
		{"clean exit, no notice", false, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := noticetest.New(1)
			release := filepath.Join(testutil.ShortDir(t), "release")
			ar := startAgent(t, func(c *Config) {
				c.Source = src
				c.Command = []string{"/bin/sh", "-c", "while [ ! -f " + release + " ]; do sleep 0.02; done; exit " + strconv.Itoa(tc.exit)}
			})
			tr := trainertest.Dial(t, ar.cfg.Server.Path)
			tr.Hello()
			if tc.notice {
				now := time.Now()
				src.C <- metadata.Notice{Cloud: metadata.CloudAWS, Kind: metadata.KindTermination, ID: "n1", Detected: now, Deadline: now.Add(time.Minute)}
				tr.Save(tr.Expect(protocol.TypeCheckpoint), 3, "w")
				tr.Expect(protocol.TypeCommitted)
				if s := tr.Expect(protocol.TypeStop); s.Reason != protocol.ReasonInterruption {
					t.Fatalf("stop=%+v", s)
				}
			}
			os.WriteFile(release, nil, 0o600)
			if got := ar.wait(t); got != tc.want {
				t.Fatalf("exit code=%d, want %d", got, tc.want)
			}
		})
	}
}

// TestAgent_LateNotice: a termination notice whose deadline has already
// passed still asks for a checkpoint, with a short deadline in the future,
// and commits it.
func TestAgent_LateNotice(t *testing.T) {
	src := noticetest.New(1)
	ar := startAgent(t, func(c *Config) { c.Source = src; c.Margin = 100 * time.Millisecond })
	tr := trainertest.Dial(t, ar.cfg.Server.Path)
	tr.Hello()
	now := time.Now()
	src.C <- metadata.Notice{Cloud: metadata.CloudAWS, Kind: metadata.KindTermination, ID: "late", Detected: now, Deadline: now.Add(-time.Minute)}
	req := tr.Expect(protocol.TypeCheckpoint)
	if req.Reason != protocol.ReasonInterruption || req.Deadline == nil || !req.Deadline.After(now) || req.Deadline.After(now.Add(lateNoticeGrace)) {
		t.Fatalf("request=%+v, want an interruption checkpoint due within %v of the notice", req, lateNoticeGrace)
	}
	tr.Save(req, 8, "w")
	tr.Expect(protocol.TypeCommitted)
	s := tr.Expect(protocol.TypeStop)
	if s.Reason != protocol.ReasonInterruption || s.Deadline == nil || !s.Deadline.After(now) {
		t.Fatalf("stop=%+v", s)
	}
	if got := latestStep(t, ar); got != 8 {
		t.Fatalf("latest step=%d, want 8", got)
	}
}

// TestAgent_SIGTERMDuringInterruption: a drain's SIGTERM while the
// interruption checkpoint is in flight folds into it: no second
// (shutdown) request, the earlier deadline stays, one commit, one stop.
func TestAgent_SIGTERMDuringInterruption(t *testing.T) {
	src := noticetest.New(1)
	ar := startAgent(t, func(c *Config) { c.Source = src; c.TermGrace = time.Hour })
	tr := trainertest.Dial(t, ar.cfg.Server.Path)
	tr.Hello()
	now := time.Now()
	deadline := now.Add(time.Minute).Truncate(time.Millisecond)
	src.C <- metadata.Notice{Cloud: metadata.CloudAWS, Kind: metadata.KindTermination, ID: "n1", Detected: now, Deadline: deadline}
	req := tr.Expect(protocol.TypeCheckpoint)
	ar.sigs <- syscall.SIGTERM
	ar.waitStatus(t, "the signal taken in", func(s Status) bool { return s.NoticesSeen == 2 })
	tr.Save(req, 11, "w")
	// A second checkpoint request here would fail these expectations.
	if c := tr.Expect(protocol.TypeCommitted); c.ID != req.ID {
		t.Fatalf("committed=%+v, want %s", c, req.ID)
	}
	s := tr.Expect(protocol.TypeStop)
	if s.Reason != protocol.ReasonInterruption || s.Deadline == nil || !s.Deadline.Equal(deadline) {
		t.Fatalf("stop=%+v, want reason interruption and the notice's deadline %v", s, deadline)
	}
	if code := ar.wait(t); code != 0 {
		t.Fatalf("exit code=%d, want 0 (no child)", code)
	}
	j, err := journal.Read(context.Background(), ar.store, "test")
	if err != nil || len(j.Interruptions) != 1 || !j.Interruptions[0].CommitOK {
		t.Fatalf("journal interruptions=%+v err=%v, want one committed", j.Interruptions, err)
	}
}

// TestAgent_SignalsWithinWindowAreOne: GNU timeout, `kill 0` and some init
// systems signal the agent and the trainer's group at once, so the agent
// sees two SIGTERMs within milliseconds. They are one shutdown: the final
// checkpoint still commits and the agent exits 75, not 143 (issue 24.9).
// A second signal after the window still stops at once.
func TestAgent_SignalsWithinWindowAreOne(t *testing.T) {
	release := filepath.Join(testutil.ShortDir(t), "release")
	ar := startAgent(t, func(c *Config) {
		c.Command = []string{"/bin/sh", "-c", "while [ ! -f " + release + " ]; do sleep 0.02; done"}
		c.SignalWindow = time.Hour // whatever the machine's speed, both signals fall inside it
	})
	tr := trainertest.Dial(t, ar.cfg.Server.Path)
	tr.Hello()
	ar.sigs <- syscall.SIGTERM
	ar.sigs <- syscall.SIGTERM
	req := tr.Expect(protocol.TypeCheckpoint)
	if req.Reason != protocol.ReasonShutdown {
		t.Fatalf("request reason %q, want shutdown", req.Reason)
	}
	tr.Save(req, 9, "w")
	tr.Expect(protocol.TypeCommitted)
	tr.Expect(protocol.TypeStop)
	os.WriteFile(release, nil, 0o600)
	if code := ar.wait(t); code != ExitInterrupted {
		t.Fatalf("exit code %d, want %d: two signals within the window must be one shutdown", code, ExitInterrupted)
	}
	if l, err := checkpoint.ReadLatest(context.Background(), ar.store); err != nil || l.Step != 9 {
		t.Fatalf("latest = %+v, %v; want step 9", l, err)
	}
}

// TestAgent_SecondSignalAfterWindowStops: past the window, a second signal
// is a deliberate second Ctrl-C and stops the trainer at once.
func TestAgent_SecondSignalAfterWindowStops(t *testing.T) {
	ar := startAgent(t, func(c *Config) {
		c.Command = []string{"/bin/sh", "-c", "sleep 60"}
		c.TermGrace = time.Hour
		c.SignalWindow = time.Nanosecond // any later signal is past it
	})
	tr := trainertest.Dial(t, ar.cfg.Server.Path)
	tr.Hello()
	ar.sigs <- syscall.SIGTERM
	tr.Expect(protocol.TypeCheckpoint) // never answered
	ar.sigs <- syscall.SIGTERM
	if code := ar.wait(t); code != 128+int(syscall.SIGTERM) {
		t.Fatalf("exit code %d, want %d", code, 128+int(syscall.SIGTERM))
	}
}

// Issue 24.7: the kubelet always SIGTERMs a sidecar, also after its
// trainer exited 0. A trainer that said bye before leaving finished its
// work: the SIGTERM interrupts nothing and the journal records no
// interruption and no lost work. One that left without bye (crashed)
// still counts as interrupted.
func TestSidecar_SignalAfterTrainerFinished(t *testing.T) {
	for _, bye := range []bool{true, false} {
		t.Run(fmt.Sprintf("bye=%v", bye), func(t *testing.T) {
			ar := startAgent(t, nil) // no command: a sidecar
			tr := trainertest.Dial(t, ar.cfg.Server.Path)
			tr.Hello()
			tr.Send(map[string]any{"type": "progress", "step": 46})
			if bye {
				tr.Send(map[string]any{"type": "bye", "step": 46})
			}
			ar.waitStatus(t, "the trainer's progress", func(s Status) bool { return s.Trainers == 1 && s.Step == 46 })
			tr.Close()
			ar.waitStatus(t, "the trainer gone", func(s Status) bool { return s.Trainers == 0 })
			ar.sigs <- syscall.SIGTERM
			if code := ar.wait(t); code != 0 {
				t.Fatalf("sidecar exit code %d, want 0", code)
			}
			j, err := journal.Read(context.Background(), ar.store, ar.cfg.RunID)
			if err != nil {
				t.Fatal(err)
			}
			if got := len(j.Interruptions); (got == 0) != bye {
				t.Fatalf("bye=%v: %d interruptions recorded %+v", bye, got, j.Interruptions)
			}
			g, err := journal.Account(j, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			if lost := g.Seconds[journal.BucketLost]; bye && lost != 0 {
				t.Fatalf("a finished trainer lost %.3fs of work", lost)
			}
		})
	}
}

// TestAgent_LoopNeverWaitsOnATrainer (issue 26.2): a trainer that stops
// reading its socket (here: floods status requests and reads nothing)
// costs its own connection, never the loop. With a write timeout of an
// hour, a loop that waited on that socket would welcome nobody else.
func TestAgent_LoopNeverWaitsOnATrainer(t *testing.T) {
	ar := startAgent(t, func(c *Config) { c.Server.WriteTimeout = time.Hour })
	other := trainertest.Dial(t, ar.cfg.Server.Path) // waits for the socket
	stuck, err := net.Dial("unix", ar.cfg.Server.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer stuck.Close()
	flood := []byte(strings.Repeat("{\"type\":\"status\"}\n", 4000))
	go stuck.Write(flood) // never reads a reply
	ar.waitStatus(t, "the flood read", func(Status) bool { return true })
	other.Hello()
	ar.waitStatus(t, "the loop answering", func(s Status) bool { return s.Trainers == 1 })
}

// Issue 29: an agent with a fleet store records its session in the fleet
// summary at its end, so that `spotagent fleet` and the next run's prior
// need not read every journal.
func TestAgent_RecordsItsSessionInTheFleet(t *testing.T) {
	root := testutil.ShortDir(t)
	fl, err := file.New(root)
	if err != nil {
		t.Fatal(err)
	}
	ar := startAgent(t, func(c *Config) {
		st, err := file.New(filepath.Join(root, "r1"))
		if err != nil {
			t.Fatal(err)
		}
		c.Store, c.Fleet, c.FleetDir = st, fl, "r1"
	})
	tr := trainertest.Dial(t, ar.cfg.Server.Path)
	tr.Hello()
	ar.sigs <- syscall.SIGTERM
	tr.Save(tr.Expect(protocol.TypeCheckpoint), 12, "w")
	tr.Expect(protocol.TypeCommitted)
	tr.Expect(protocol.TypeStop)
	tr.Close()
	ar.wait(t)
	s, err := fleet.ReadSummary(context.Background(), fl)
	if err != nil {
		t.Fatal(err)
	}
	if r := s.Runs["r1"]; r == nil {
		t.Fatalf("fleet summary %+v: no entry for run r1", s.Runs)
	}
}

// Issue 28.2: a trainer command that cannot start exits 127 (126) before
// the agent touches the store: no lease, no journal, nothing restored.
func TestAgent_TrainerThatCannotStartTouchesNoStore(t *testing.T) {
	dir := testutil.ShortDir(t)
	st, err := file.New(filepath.Join(dir, "store"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{RunID: "x", CheckpointDir: filepath.Join(dir, "ckpt"), Store: st,
		Server: protocol.ServerConfig{Path: filepath.Join(dir, "a.sock")}, Command: []string{filepath.Join(dir, "no-such-trainer")}}
	code, err := Run(context.Background(), cfg, nil)
	if code != 127 || err == nil {
		t.Fatalf("Run: %d, %v; want 127 and an error", code, err)
	}
	n := 0
	st.List(context.Background(), "", func(o cloud.ObjectInfo) error { n++; return nil })
	if n != 0 {
		t.Fatalf("%d objects in the store after a start that failed; want none", n)
	}
}

// A launcher that hides its workers' codes (torchrun: 1) after a stop whose
// checkpoint did not commit: the ranks wrote 75 to $SPOTAGENT_EXIT_FILE,
// which the agent points into its area, so the agent exits 75 as it would
// for a single trainer; without that file the 1 stands.
func TestAgent_LauncherOneWithExitFile(t *testing.T) {
	for _, wrote := range []bool{true, false} {
		t.Run(fmt.Sprintf("wrote=%v", wrote), func(t *testing.T) {
			release := filepath.Join(testutil.ShortDir(t), "release")
			write := ""
			if wrote {
				write = `echo 75 > "$SPOTAGENT_EXIT_FILE"; `
			}
			ar := startAgent(t, func(c *Config) {
				c.Command = []string{"/bin/sh", "-c", "while [ ! -f " + release + " ]; do sleep 0.02; done; " + write + "exit 1"}
			})
			tr := trainertest.Dial(t, ar.cfg.Server.Path)
			tr.Hello()
			ar.sigs <- syscall.SIGTERM
			req := tr.Expect(protocol.TypeCheckpoint)
			tr.Send(map[string]any{"type": "failed", "id": req.ID, "error": "disk full"})
			tr.Expect(protocol.TypeStop)
			os.WriteFile(release, nil, 0o600)
			want := 1
			if wrote {
				want = ExitInterrupted
			}
			if code := ar.wait(t); code != want {
				t.Fatalf("exit code %d, want %d", code, want)
			}
		})
	}
}

// deleteGate holds every Delete until its gate closes.
type deleteGate struct {
	cloud.Store
	gate    chan struct{}
	waiting atomic.Int32
}

func (d *deleteGate) Delete(ctx context.Context, key string) error {
	d.waiting.Add(1)
	select {
	case <-d.gate:
	case <-ctx.Done():
		return ctx.Err()
	}
	return d.Store.Delete(ctx, key)
}

// TestAgent_CommittedBeforeRetention: a commit's `committed` (and so an
// interruption's stop) never waits for retention's deletes of older
// checkpoints, which run after it; retention still happens.
func TestAgent_CommittedBeforeRetention(t *testing.T) {
	st, err := file.New(filepath.Join(testutil.ShortDir(t), "store"))
	if err != nil {
		t.Fatal(err)
	}
	dg := &deleteGate{Store: st, gate: make(chan struct{})}
	released := false
	release := func() {
		if !released {
			released = true
			close(dg.gate)
		}
	}
	t.Cleanup(release) // before startAgent's cleanup: an agent in a Delete can end
	ar := startAgent(t, func(c *Config) {
		c.Store, c.Keep = dg, 1
		c.Scheduler = schedule.NewScheduler(schedule.SchedulerConfig{Fixed: 50 * time.Millisecond})
	})
	tr := trainertest.Dial(t, ar.cfg.Server.Path)
	tr.Hello()
	for step := int64(1); step <= 2; step++ {
		req := tr.Expect(protocol.TypeCheckpoint)
		tr.Save(req, step*10, "w")
		// The second commit's retention deletes the first: held.
		tr.Expect(protocol.TypeCommitted)
	}
	testutil.WaitFor(t, "retention's delete of the first checkpoint, held", func() bool { return dg.waiting.Load() > 0 })
	release()
	testutil.WaitFor(t, "retention to leave one checkpoint", func() bool {
		ms, err := checkpoint.ListManifests(context.Background(), st)
		return err == nil && len(ms) == 1 && ms[0].Manifest != nil && ms[0].Manifest.Step >= 20
	})
}

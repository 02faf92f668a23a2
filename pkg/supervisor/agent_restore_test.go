package supervisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
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
	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/file"
	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/protocol"
)

// TestAgent_OverlapRestoreSignal: SIGTERM while the restore runs beside
// the trainer's start (its files held by the store, one of them already
// in the partial directory): the restore is cancelled, the waiting
// trainer told restore_failed, the trainer process gone by the agent's
// exit, and Run exits 143 as a cancelled start does ("start-up cancelled
// by terminated"), leaving no partial restore on the disk. The env said
// SPOTAGENT_RESUME=pending. (The end-to-end
// TestRestoreOverlap_SigtermDuringRestore was cut in #49.)
func TestAgent_OverlapRestoreSignal(t *testing.T) {
	gated := newGatedStore(t, false)
	tmp := testutil.ShortDir(t)
	envOut, pidOut := filepath.Join(tmp, "env"), filepath.Join(tmp, "pid")
	ar := startAgentErr(t, func(c *Config) {
		c.Store, c.OverlapRestore = gated, true
		c.Command = []string{"/bin/sh", "-c", `echo $$ > ` + pidOut + `; env > ` + envOut + `.tmp && mv ` + envOut + `.tmp ` + envOut + `; exec sleep 60`}
	}, true)
	tr := trainertest.Dial(t, ar.cfg.Server.Path)
	tr.Send(map[string]any{"type": "hello", "pid": os.Getpid(), "version": 2})
	if w := tr.Expect(protocol.TypeWelcome); w.Restore != protocol.RestorePending || w.Resume != nil || w.Version != 2 {
		t.Fatalf("welcome %+v, want version 2, restore pending, no resume", w)
	}
	testutil.WaitFor(t, "the trainer's environment", func() bool { _, err := os.Stat(envOut); return err == nil })
	env, err := os.ReadFile(envOut)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(env), "SPOTAGENT_RESUME=pending\n") || strings.Contains(string(env), "SPOTAGENT_RESUME_DIR=") {
		t.Fatalf("trainer environment does not say the restore is pending:\n%s", env)
	}
	restoreDir := filepath.Join(ar.cfg.CheckpointDir, "spotagent-test", "restore")
	partials := func() int { return partialRestores(t, restoreDir) }
	testutil.WaitFor(t, "the restore under way: its partial directory, a file held", func() bool {
		gated.mu.Lock()
		defer gated.mu.Unlock()
		return gated.gets >= 2 && partials() == 1
	})
	ar.sigs <- syscall.SIGTERM
	if f := tr.Expect(protocol.TypeRestoreFailed); !strings.Contains(f.Error, "restore cancelled") {
		t.Fatalf("restore_failed %q, want it to say the restore was cancelled", f.Error)
	}
	if code := ar.wait(t); code != 128+int(syscall.SIGTERM) || ar.err == nil || !strings.Contains(ar.err.Error(), "start-up cancelled by terminated") {
		t.Fatalf("exit code %d (%v), want 143: start-up cancelled by terminated", code, ar.err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(testutil.ReadFile(t, pidOut)))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("the trainer (pid %d) is still there after the agent's exit: %v", pid, err)
	}
	if n := partials(); n != 0 {
		t.Fatalf("%d partial restore(s) left behind in %s", n, restoreDir)
	}
}

// partialRestores is how many partial restores (.partial-*) restoreDir
// holds.
func partialRestores(t *testing.T, restoreDir string) (n int) {
	t.Helper()
	ents, err := os.ReadDir(restoreDir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".partial-") {
			n++
		}
	}
	return n
}

// TestAgent_OverlapRestoreFailsHalfWay: the restore beside the trainer's
// start fails half-way (its first file in the partial directory, the
// second's GET fails once the trainer waits for its resume): the waiting
// trainer is told restore_failed with the store's error (never restored,
// never a fresh start), the agent logs why once, gives the trainer
// --kill-after to exit on its own and then stops it (its process gone by
// the agent's exit), and Run returns the restore's error with exit 1,
// leaving no partial restore on the disk. (The end-to-end
// TestRestoreOverlap_FailsHalfWay was cut in #49; the golden
// restore_failed.jsonl holds the message, python/tests/test_restore.py the
// client's RestoreFailed on it.)
func TestAgent_OverlapRestoreFailsHalfWay(t *testing.T) {
	gated := newGatedStore(t, true)
	defer gated.release()
	pidOut := filepath.Join(testutil.ShortDir(t), "pid")
	core, logs := observer.New(zap.InfoLevel)
	ar := startAgentErr(t, func(c *Config) {
		c.Store, c.OverlapRestore, c.Log = gated, true, zap.New(core)
		c.Command = []string{"/bin/sh", "-c", `echo $$ > ` + pidOut + `.tmp && mv ` + pidOut + `.tmp ` + pidOut + `; exec sleep 60`}
	}, true)
	tr := trainertest.Dial(t, ar.cfg.Server.Path)
	tr.Send(map[string]any{"type": "hello", "pid": os.Getpid(), "version": 2})
	if w := tr.Expect(protocol.TypeWelcome); w.Restore != protocol.RestorePending || w.Resume != nil {
		t.Fatalf("welcome %+v, want restore pending, no resume", w)
	}
	restoreDir := filepath.Join(ar.cfg.CheckpointDir, "spotagent-test", "restore")
	testutil.WaitFor(t, "the restore half-way: its partial directory, the second file's GET held", func() bool {
		gated.mu.Lock()
		defer gated.mu.Unlock()
		return gated.gets >= 2 && partialRestores(t, restoreDir) == 1
	})
	testutil.WaitFor(t, "the trainer's pid", func() bool { _, err := os.Stat(pidOut); return err == nil })
	gated.release() // the held GET fails: connection reset by peer
	if f := tr.Expect(protocol.TypeRestoreFailed); !strings.HasPrefix(f.Error, "restore: ") || !strings.Contains(f.Error, "connection reset by peer") {
		t.Fatalf("restore_failed %q, want the restore's error", f.Error)
	}
	if code := ar.wait(t); code != 1 || ar.err == nil || !strings.HasPrefix(ar.err.Error(), "restore: ") {
		t.Fatalf("exit code %d (%v), want 1: restore: ...", code, ar.err)
	}
	if m, ok := tr.Next(protocol.TypeRestored, time.Second); ok {
		t.Fatalf("the trainer was handed a resume after its restore failed: %+v", m)
	}
	if n := logs.FilterMessage("restore failed: the trainer is told and stopped; the agent exits 1").Len(); n != 1 {
		t.Fatalf("%d log entries say the restore failed, want one", n)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(testutil.ReadFile(t, pidOut)))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("the trainer (pid %d) is still there after the agent's exit: %v", pid, err)
	}
	if n := partialRestores(t, restoreDir); n != 0 {
		t.Fatalf("%d partial restore(s) left behind in %s", n, restoreDir)
	}
}

// TestAgent_OverlapRestoreHeldWelcome: a protocol 1 trainer that connects
// while the restore runs gets no welcome until the restore is in place,
// and then the resume; a protocol 2 trainer gets restored, with the same
// files in place.
func TestAgent_OverlapRestoreHeldWelcome(t *testing.T) {
	gated := newGatedStore(t, false)
	ar := startAgent(t, func(c *Config) { c.Store, c.OverlapRestore = gated, true })
	v2 := trainertest.Dial(t, ar.cfg.Server.Path)
	v2.Send(map[string]any{"type": "hello", "pid": os.Getpid(), "version": 2})
	v2.Expect(protocol.TypeWelcome)
	v1 := trainertest.Dial(t, ar.cfg.Server.Path)
	v1.Send(map[string]any{"type": "hello", "pid": os.Getpid()})
	// The v1 hello is in the loop before the store is released: a status
	// round trip on the same connection comes after it.
	v1.Send(map[string]any{"type": "status"})
	if m := v1.Expect(protocol.TypeStatus); m.Type != protocol.TypeStatus {
		t.Fatalf("got %+v", m)
	}
	gated.release()
	r := v2.Expect(protocol.TypeRestored)
	w := v1.Expect(protocol.TypeWelcome)
	for _, res := range []*protocol.Resume{r.Resume, w.Resume} {
		if res == nil || res.Step != 7 || res.ID != "60d0000000a7" {
			t.Fatalf("resume %+v, want step 7", res)
		}
		b, err := os.ReadFile(filepath.Join(res.Dir, "b.bin"))
		if err != nil || string(b) != "second file" {
			t.Fatalf("restored b.bin = %q %v", b, err)
		}
	}
	if w.Version != 1 || w.Restore != "" {
		t.Fatalf("welcome to protocol 1: %+v", w)
	}
}

// TestAgent_TrainerThatExitsAtOnceRecordsNoFleet (#41 item 5): a trainer
// that exits while the restore still runs beside its start leaves no
// session in the journal: the agent writes no fleet record and warns of
// nothing (it once warned "journal has no sessions").
func TestAgent_TrainerThatExitsAtOnceRecordsNoFleet(t *testing.T) {
	gated := newGatedStore(t, false)
	defer gated.release()
	fl, err := file.New(testutil.ShortDir(t))
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.DebugLevel)
	ar := startAgentErr(t, func(c *Config) {
		c.Store, c.OverlapRestore, c.Fleet, c.FleetDir = gated, true, fl, "r1"
		c.Command = []string{"/bin/sh", "-c", "exit 0"}
		c.Log = zap.New(core)
	}, true)
	ar.wait(t)
	for _, e := range logs.All() {
		if e.Level >= zap.WarnLevel && strings.Contains(e.Message+fmt.Sprint(e.ContextMap()), "fleet") {
			t.Errorf("%v %q %v", e.Level, e.Message, e.ContextMap())
		}
	}
	if logs.FilterMessageSnippet("no fleet record").Len() != 1 {
		t.Errorf("no debug line says why no fleet record was written")
	}
	n := 0
	fl.List(context.Background(), "", func(cloud.ObjectInfo) error { n++; return nil })
	if n != 0 {
		t.Fatalf("%d objects in the fleet store after a session that never began", n)
	}
}

// stopsDuringRestart: the two ways a stop reaches an agent whose trainer
// waits to restart: a SIGTERM, and a termination notice with grace left.
func stopsDuringRestart(grace time.Duration) []struct {
	name string
	stop func(ar *agentRun, src *noticetest.Source)
} {
	return []struct {
		name string
		stop func(ar *agentRun, src *noticetest.Source)
	}{
		{"SIGTERM", func(ar *agentRun, _ *noticetest.Source) { ar.sigs <- syscall.SIGTERM }},
		{"Notice", func(_ *agentRun, src *noticetest.Source) {
			now := time.Now()
			src.C <- metadata.Notice{Cloud: metadata.CloudAWS, Kind: metadata.KindTermination, ID: "n1", Detected: now, Deadline: now.Add(grace)}
		}},
	}
}

// TestAgent_SignalDuringRestartRestore (#49 item 2): a trainer crashes,
// and the restore before its restart hangs on the store. A SIGTERM (or a
// termination notice) meanwhile is handled at once: the restore is
// cancelled (its partial directory goes), the trainer is not started
// again, and the agent exits 75 (interrupted, run me again) within its
// grace, without waiting for the restore. (The restart's restore used to
// run on the loop: the signal waited for it, up to 10 minutes.)
func TestAgent_SignalDuringRestartRestore(t *testing.T) {
	const grace = 20 * time.Second
	for _, tc := range stopsDuringRestart(grace) {
		t.Run(tc.name, func(t *testing.T) {
			dir := testutil.ShortDir(t)
			st, err := file.New(filepath.Join(dir, "store"))
			if err != nil {
				t.Fatal(err)
			}
			src := t.TempDir()
			if err := os.WriteFile(filepath.Join(src, "w.pt"), []byte("the trainer's state"), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := (&commit.Committer{Store: st, RunID: "test"}).Commit(t.Context(), commit.Request{Dir: src, ID: "60d0000000a7", Step: 7}); err != nil {
				t.Fatal(err)
			}
			hs := &heldStore{Store: st} // agent_rejoin_test.go
			notices := noticetest.New(1)
			runs, crash := filepath.Join(dir, "runs"), filepath.Join(dir, "crash")
			core, logs := observer.New(zap.InfoLevel)
			ar := startAgent(t, func(c *Config) {
				c.Store, c.Source, c.MaxRestarts, c.TermGrace, c.Log = hs, notices, 1, grace, zap.New(core)
				// It crashes when told; its restored copy goes with it, so
				// that the restart's restore must read the store.
				c.Command = []string{"/bin/sh", "-c", `echo run >> ` + runs + `; while [ ! -e ` + crash + ` ]; do sleep 0.05; done; rm -rf "$SPOTAGENT_RESUME_DIR"; exit 3`}
			})
			testutil.WaitFor(t, "the trainer's start", func() bool { _, err := os.Stat(runs); return err == nil })
			hs.arm()
			t.Cleanup(func() { close(hs.gate) }) // before startAgent's cleanup: an agent stuck in the restore can end
			if err := os.WriteFile(crash, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			testutil.WaitFor(t, "the restart's restore held by the store", func() bool { return hs.held() > 0 })
			tc.stop(ar, notices)
			select {
			case code := <-ar.done:
				ar.done <- code
				if code != ExitInterrupted {
					t.Fatalf("exit code %d, want %d (interrupted before the trainer could restart)", code, ExitInterrupted)
				}
			case <-time.After(grace):
				t.Fatalf("stop during a restart's restore: the agent did not end within its grace (%v): it waits for the restore", grace)
			}
			if b, _ := os.ReadFile(runs); strings.Count(string(b), "run") != 1 {
				t.Fatalf("the trainer ran %d times, want once: a stop during the restart's restore starts no trainer", strings.Count(string(b), "run"))
			}
			// The cancelled restart's trainer is not running: no trainer,
			// not a restore someone waits on.
			if n := logs.FilterMessage("no trainer connected: nothing to checkpoint before the deadline").Len(); n != 1 {
				t.Fatalf("%d 'no trainer connected' warnings at the stop, want 1 (restore lines: %d)", n,
					logs.FilterMessageSnippet("a restore runs").Len())
			}
			filepath.WalkDir(ar.cfg.CheckpointDir, func(p string, d fs.DirEntry, err error) error {
				if err == nil && strings.HasPrefix(d.Name(), ".partial-") {
					t.Errorf("the cancelled restore left %s", p)
				}
				return nil
			})
		})
	}
}

// TestAgent_SignalDuringRestartBackoff: a trainer crashed and its restart
// waits out the backoff; a SIGTERM or a termination notice meanwhile
// cancels the restart: the agent exits 75 within its grace and the
// trainer is not started again (it was: restored and started after the
// backoff, up to 64 s later, only to be told to stop).
func TestAgent_SignalDuringRestartBackoff(t *testing.T) {
	const grace = 20 * time.Second
	for _, tc := range stopsDuringRestart(grace) {
		t.Run(tc.name, func(t *testing.T) {
			dir := testutil.ShortDir(t)
			notices := noticetest.New(1)
			runs := filepath.Join(dir, "runs")
			ar := startAgent(t, func(c *Config) {
				c.Source, c.MaxRestarts, c.TermGrace = notices, 1, grace
				c.RestartBackoff = time.Hour // the stop comes during it, whatever the load
				c.Command = []string{"/bin/sh", "-c", `echo run >> ` + runs + `; exit 3`}
			})
			ar.waitStatus(t, "the trainer's crash and its restart pending", func(s Status) bool {
				return s.Child != nil && s.Child.Restarts == 1 && !s.Child.Running
			})
			tc.stop(ar, notices)
			select {
			case code := <-ar.done:
				ar.done <- code
				if code != ExitInterrupted {
					t.Fatalf("exit code %d, want %d (interrupted before the trainer could restart)", code, ExitInterrupted)
				}
			case <-time.After(grace):
				t.Fatalf("stop during a restart's backoff: the agent did not end within its grace (%v): it waits to restart", grace)
			}
			if b, _ := os.ReadFile(runs); strings.Count(string(b), "run") != 1 {
				t.Fatalf("the trainer ran %d times, want once", strings.Count(string(b), "run"))
			}
		})
	}
}

// slowGets is a store whose GETs of the keys match picks never answer
// (every 0: until their context ends) or deliver at most 2 KiB each
// every.
type slowGets struct {
	cloud.Store
	match func(key string) bool
	every time.Duration
	n     atomic.Int32 // GETs matched
}

func (s *slowGets) Get(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	if !s.match(key) {
		return s.Store.Get(ctx, key, off, n)
	}
	s.n.Add(1)
	if s.every == 0 {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	r, err := s.Store.Get(ctx, key, off, n)
	if err != nil {
		return nil, err
	}
	return trickle{ctx: ctx, ReadCloser: r, every: s.every}, nil
}

// trickle reads 2 KiB at most per every, until its context ends.
type trickle struct {
	io.ReadCloser
	ctx   context.Context
	every time.Duration
}

func (r trickle) Read(b []byte) (int, error) {
	select {
	case <-r.ctx.Done():
		return 0, r.ctx.Err()
	case <-time.After(r.every): // the store's pace, not a synchronisation
	}
	return r.ReadCloser.Read(b[:min(len(b), 2<<10)])
}

// TestStart_SignalCancelsSerialRestore: the serial start (the restore,
// then the trainer) held up by the store, one that never answers the GET
// of latest.json and one that serves the checkpoint's 2 MiB at 80 KiB/s
// (the agent logs the restore's progress: bytes, total, rate, eta):
// SIGTERM ends the start at once (within 10 s, as the end-to-end test
// bounded it), logged once ("signal during start-up"):
// Run returns 143 with "start-up cancelled by terminated", the trainer is
// never started, no partial restore is left. (The end-to-end
// TestStartup_SlowStoreCancelled was cut in #49; TestStart_SignalCancelsRestore
// holds the same in zero-code mode.)
func TestStart_SignalCancelsSerialRestore(t *testing.T) {
	for _, tc := range []struct {
		name     string
		match    string        // the suffix of the keys held
		every    time.Duration // 0: never answered
		progress bool          // wait for a restore progress line before the signal
	}{
		{"NeverAnswers", "latest.json", 0, false},
		{"Trickle", "/state.bin", 25 * time.Millisecond, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := testutil.ShortDir(t)
			st, err := file.New(filepath.Join(dir, "store"))
			if err != nil {
				t.Fatal(err)
			}
			src := t.TempDir()
			if err := os.WriteFile(filepath.Join(src, "state.bin"), []byte(strings.Repeat("s", 2<<20)), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := (&commit.Committer{Store: st, RunID: "test"}).Commit(t.Context(), commit.Request{Dir: src, ID: "60d0000000a7", Step: 10}); err != nil {
				t.Fatal(err)
			}
			slow := &slowGets{Store: st, match: func(k string) bool { return strings.HasSuffix(k, tc.match) }, every: tc.every}
			core, logs := observer.New(zap.InfoLevel)
			ran := filepath.Join(dir, "ran")
			ar := startAgentErr(t, func(c *Config) {
				c.Store, c.Log = slow, zap.New(core)
				c.Command = []string{"/bin/sh", "-c", "touch " + ran}
			}, true)
			testutil.WaitFor(t, "the start held up by the store", func() bool { return slow.n.Load() > 0 })
			if tc.progress {
				// Every 5 s; the bytes count in 64 KiB steps.
				var f map[string]any
				testutil.WaitWithin(t, "a restore progress line with bytes", time.Minute, func() bool {
					for _, e := range logs.FilterMessage("restore progress").All() {
						if f = e.ContextMap(); f["bytes"] != int64(0) {
							return true
						}
					}
					return false
				})
				if b, _ := f["bytes"].(int64); b <= 0 || b >= 2<<20 || f["total"] != int64(2<<20) || f["mb_per_s"] == nil || f["eta"] == nil {
					t.Fatalf("restore progress %v, want bytes under way of 2 MiB, the rate and an eta", f)
				}
			}
			sent := time.Now()
			ar.sigs <- syscall.SIGTERM
			code := ar.wait(t)
			if took := time.Since(sent); took > 10*time.Second {
				t.Errorf("SIGTERM took %s to end the start", took)
			}
			if code != 128+int(syscall.SIGTERM) || ar.err == nil || !strings.Contains(ar.err.Error(), "start-up cancelled by terminated") {
				t.Fatalf("exit code %d (%v), want 143: start-up cancelled by terminated", code, ar.err)
			}
			if n := logs.FilterMessageSnippet("signal during start-up").Len(); n != 1 {
				t.Errorf("%d log entries say a signal came during start-up, want one", n)
			}
			if _, err := os.Stat(ran); err == nil {
				t.Fatal("the trainer was started")
			}
			if n := partialRestores(t, filepath.Join(ar.cfg.CheckpointDir, "spotagent-test", "restore")); n != 0 {
				t.Fatalf("%d partial restore(s) left behind", n)
			}
		})
	}
}

// TestAgent_NoticeDuringStartRestoreExitCode: a start given up during the
// restore for a notice stops a trainer that never connected. Its answer
// to that SIGTERM (143, or torchrun's 1) gives 75, run me again; its own
// failure (here 3) passes through, as after a stop (docs/protocol.md;
// TestAgentSim seed 68074 exited 75 on a trainer's own 3). The agent
// says nothing of a trainer it stopped itself never connecting.
func TestAgent_NoticeDuringStartRestoreExitCode(t *testing.T) {
	for _, c := range []struct {
		name   string
		onTerm string
		want   int
	}{{"sigterm", "", 75}, {"torchrun's 1", "exit 1", 75}, {"its own 3", "exit 3", 3}} {
		t.Run(c.name, func(t *testing.T) {
			gated := newGatedStore(t, false)
			notices := noticetest.New(1)
			core, logs := observer.New(zap.InfoLevel)
			trap := ""
			if c.onTerm != "" {
				trap = "trap '" + c.onTerm + "' TERM; "
			}
			ar := startAgentErr(t, func(c *Config) {
				c.Store, c.OverlapRestore, c.Source, c.Log = gated, true, notices, zap.New(core)
				c.Command = []string{"/bin/sh", "-c", trap + "while :; do sleep 0.1; done"} // never connects
			}, true)
			testutil.WaitFor(t, "the restore under way", func() bool {
				gated.mu.Lock()
				defer gated.mu.Unlock()
				return gated.gets >= 2
			})
			now := time.Now()
			notices.C <- metadata.Notice{Cloud: metadata.CloudAWS, Kind: metadata.KindTermination, ID: "n1", Detected: now, Deadline: now.Add(time.Minute)}
			if code := ar.wait(t); code != c.want {
				t.Fatalf("exit code %d (%v), want %d", code, ar.err, c.want)
			}
			if n := logs.FilterMessageSnippet("exited without ever connecting").Len(); n != 0 {
				t.Fatalf("%d warnings that the trainer the agent stopped never connected, want none", n)
			}
		})
	}
}

package supervisor

// The signal fallback (Config.Signal, `spotagent run --signal`): a
// trainer that does not speak the protocol is asked for each checkpoint
// by a request file and a signal (internal/sigbridge), and answers with a
// marker file. These run the real loop, the bridge and a real child.

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/spotagent/spotagent/internal/child"
	"github.com/spotagent/spotagent/internal/sigbridge"
	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/schedule"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/childproc"
)

// signalWait bounds every wait here that spans a trainer's start, a save
// and a commit: generous, for a loaded machine.
const signalWait = time.Minute

// outputTo is the real Starter (internal/child) with the trainer's stdout
// and stderr in a file, which the test reads: what the trainer says.
type outputTo struct{ f *os.File }

func (o outputTo) Start(cfg child.Config) (childproc.Child, error) {
	cfg.Stdout, cfg.Stderr = o.f, o.f
	return child.Start(cfg)
}

// trainerOutput is a file for a trainer's output and a function that
// reads it.
func trainerOutput(t *testing.T, path string) (childproc.Starter, func() string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return outputTo{f}, func() string { return testutil.ReadFile(t, path) }
}

// dumpOnFailure logs, if the test fails, what the trainer and the agent
// said.
func dumpOnFailure(t *testing.T, what string, output func() string, logs *observer.ObservedLogs) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		t.Logf("%s, the trainer said:\n%s", what, output())
		for _, e := range logs.All() {
			t.Logf("%s %s %v", e.Time.Format("15:04:05.000"), e.Message, e.ContextMap())
		}
	})
}

// waitLine waits for a line of the trainer's output that matches re and
// returns its submatches.
func waitLine(t *testing.T, output func() string, re string) []string {
	t.Helper()
	rx := regexp.MustCompile("(?m)" + re)
	var m []string
	testutil.WaitWithin(t, "the trainer to say "+re, signalWait, func() bool {
		m = rx.FindStringSubmatch(output())
		return m != nil
	})
	return m
}

// waitExitWithin is the agent's exit code, failing the test if it has not
// exited within d.
func (ar *agentRun) waitExitWithin(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case code := <-ar.done:
		ar.done <- code
		return code
	case <-time.After(d):
		t.Fatalf("agent did not exit within %s", d)
	}
	return -1
}

// signalled counts the bridge's "trainer signalled" entries by request id,
// each of which must name sig.
func signalled(t *testing.T, logs *observer.ObservedLogs, sig string) map[string]int {
	t.Helper()
	n := map[string]int{}
	for _, e := range logs.FilterMessage("signal fallback: trainer signalled").All() {
		m := e.ContextMap()
		if m["signal"] != sig {
			t.Errorf("trainer signalled with %v, want %s: %v", m["signal"], sig, m)
		}
		n[fmt.Sprint(m["id"])]++
	}
	return n
}

// noCommit fails the test if anything was committed: no log entry, no
// latest.json.
func noCommit(t *testing.T, ar *agentRun, logs *observer.ObservedLogs) {
	t.Helper()
	if n := logs.FilterMessage("checkpoint committed").Len(); n != 0 {
		t.Errorf("%d checkpoints committed for a trainer that never saved one", n)
	}
	if _, err := checkpoint.ReadLatest(t.Context(), ar.store); !errors.Is(err, cloud.ErrNotExist) {
		t.Errorf("latest.json: %v, want none", err)
	}
}

// TestAgent_SignalFallback: python/examples/train_signal.py, which does
// not speak the protocol, under Signal SIGUSR1. A periodic checkpoint
// reaches it as a signal (one "trainer signalled" per request) and a
// request file; its marker commits it. SIGTERM to the agent takes a
// shutdown checkpoint, then stops the trainer: the agent exits 75. The
// marker is never committed. The next agent resumes there, and the trainer
// ends with the uninterrupted run's result, byte for byte.
func TestAgent_SignalFallback(t *testing.T) {
	const py = "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		t.Fatalf("this test runs python/examples/train_signal.py under %s: %v", py, err)
	}
	script, err := filepath.Abs(filepath.Join("..", "..", "python", "examples", "train_signal.py"))
	if err != nil {
		t.Fatal(err)
	}
	// 20000 steps of 5 ms: 100 s at least, the interrupted run never ends
	// on its own; the reference and the resumed run take no step time (the
	// result does not depend on it).
	const steps = "20000"
	dir := testutil.ShortDir(t)
	ref, out := filepath.Join(dir, "ref.json"), filepath.Join(dir, "out.json")
	if b, err := exec.Command(py, script, "--steps", steps, "--out", ref).CombinedOutput(); err != nil {
		t.Fatalf("reference run: %v\n%s", err, b)
	}

	start1, output1 := trainerOutput(t, filepath.Join(dir, "run1.log"))
	core, logs := observer.New(zap.InfoLevel)
	dumpOnFailure(t, "interrupted run", output1, logs)
	ar := startAgent(t, func(c *Config) {
		c.Signal = syscall.SIGUSR1
		c.Scheduler = schedule.NewScheduler(schedule.SchedulerConfig{Fixed: time.Second})
		c.TermGrace = signalWait
		c.Command = []string{py, script, "--steps", steps, "--step-time", "0.005", "--out", out}
		c.Child = start1
		c.Log = zap.New(core)
	})
	waitLine(t, output1, `^checkpoint saved at step \d+ \(periodic\)$`)
	testutil.WaitWithin(t, "a periodic checkpoint committed", signalWait, func() bool {
		return logs.FilterMessage("checkpoint committed").Len() > 0
	})
	ar.sigs <- syscall.SIGTERM
	if code := ar.waitExitWithin(t, signalWait); code != ExitInterrupted {
		t.Fatalf("interrupted run exit code %d, want %d", code, ExitInterrupted)
	}
	if _, err := os.Stat(out); err == nil {
		t.Fatal("interrupted run finished training: SIGTERM came too late to test anything")
	}
	// The shutdown checkpoint: a request of its own, or the periodic one
	// pending at the SIGTERM, which becomes it (the trainer read
	// "periodic" in its request file then). The trainer saved it, and was
	// stopped after its commit (SIGTERM to its group: it says so).
	stopped := logs.FilterMessage("interruption checkpoint committed: stopping the trainer").All()
	if len(stopped) != 1 {
		t.Fatalf("%d 'interruption checkpoint committed' entries, want 1", len(stopped))
	}
	step, _ := stopped[0].ContextMap()["step"].(int64)
	saved := fmt.Sprintf("checkpoint saved at step %d (shutdown)\n", step)
	for _, e := range logs.FilterMessage("the pending periodic checkpoint becomes the interruption checkpoint").All() {
		if l, err := checkpoint.ReadLatest(t.Context(), ar.store); err == nil && e.ContextMap()["id"] == l.ID {
			saved = fmt.Sprintf("checkpoint saved at step %d (periodic)\n", step)
		}
	}
	said := output1()
	if i, j := strings.Index(said, saved), strings.Index(said, "stopping at step "); i < 0 || j < i {
		t.Fatalf("the trainer said %q, want %q, then that it stops", said, saved)
	}

	// One "trainer signalled" per request, and each commit answers one.
	sent := signalled(t, logs, "SIGUSR1")
	commits := logs.FilterMessage("checkpoint committed").All()
	if len(commits) < 2 {
		t.Fatalf("%d checkpoints committed, want a periodic one and the shutdown's", len(commits))
	}
	for _, c := range commits {
		uri := fmt.Sprint(c.ContextMap()["uri"])
		var ids []string
		for id, n := range sent {
			if strings.Contains(uri, id) {
				ids = append(ids, id)
				if n != 1 {
					t.Errorf("request %s: %d 'trainer signalled' entries, want 1", id, n)
				}
			}
		}
		if len(ids) != 1 {
			t.Errorf("commit %s answers signalled requests %v, want one", uri, ids)
		}
	}
	// The shutdown checkpoint is the newest: the trainer's state, and not
	// its marker (its answer, not part of the checkpoint).
	l, err := checkpoint.ReadLatest(t.Context(), ar.store)
	if err != nil || l.Step != step {
		t.Fatalf("latest %+v (%v), want the shutdown checkpoint's step %d", l, err, step)
	}
	m, err := checkpoint.ReadManifest(t.Context(), ar.store, l.Manifest)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Files) != 1 || m.Files[0].Path != "state.json" || m.Reason != "shutdown" {
		t.Errorf("shutdown checkpoint %s: files %+v, want state.json alone", m.Reason, m.Files)
	}
	storeDir := filepath.Join(filepath.Dir(ar.cfg.CheckpointDir), "store")
	filepath.WalkDir(storeDir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && (d.Name() == sigbridge.DoneMarker || d.Name() == sigbridge.RequestFile) {
			t.Errorf("uploaded: %s", p)
		}
		return nil
	})

	start2, output2 := trainerOutput(t, filepath.Join(dir, "run2.log"))
	core2, logs2 := observer.New(zap.InfoLevel)
	dumpOnFailure(t, "resumed run", output2, logs2)
	ar2 := startAgent(t, func(c *Config) {
		c.Store = ar.store
		c.Signal = syscall.SIGUSR1
		c.Command = []string{py, script, "--steps", steps, "--out", out}
		c.Child = start2
		c.Log = zap.New(core2)
	})
	if code := ar2.waitExitWithin(t, signalWait); code != 0 {
		t.Fatalf("resumed run exit code %d", code)
	}
	if m := regexp.MustCompile(`(?m)^resumed at step (\d+)$`).FindStringSubmatch(output2()); m == nil || m[1] != strconv.FormatInt(step, 10) {
		t.Fatalf("the resumed run's trainer said %q, want it resumed at step %d", output2(), step)
	}
	if got, want := testutil.ReadFile(t, out), testutil.ReadFile(t, ref); got != want {
		t.Fatalf("resumed run's result %s, want the uninterrupted run's %s", got, want)
	}
}

// TestAgent_SignalFallbackNoHandler: a trainer that has not installed a
// handler for the signal would die of it: it is not signalled. The request
// fails with one line naming the missing handler, and the trainer keeps
// running; SIGTERM then ends it (the agent exits with its 143), and
// nothing is committed.
func TestAgent_SignalFallbackNoHandler(t *testing.T) {
	alive := filepath.Join(testutil.ShortDir(t), "alive")
	core, logs := observer.New(zap.InfoLevel)
	ar := startAgent(t, func(c *Config) {
		c.Signal = syscall.SIGUSR1
		c.Scheduler = schedule.NewScheduler(schedule.SchedulerConfig{Fixed: 100 * time.Millisecond})
		c.Command = []string{"/bin/sh", "-c", "while :; do touch " + alive + "; sleep 0.05; done"}
		c.Log = zap.New(core)
	})
	dumpOnFailure(t, "no handler", func() string { return "(its output not kept)" }, logs)
	refused := func() []observer.LoggedEntry {
		return logs.FilterMessage("trainer could not save the checkpoint").All()
	}
	testutil.WaitWithin(t, "a request refused for want of a handler (or committed)", signalWait, func() bool {
		return len(refused()) > 0 || logs.FilterMessage("checkpoint committed").Len() > 0
	})
	if noCommit(t, ar, logs); t.Failed() {
		t.FailNow()
	}
	// A fresh sign of life after the refusal.
	if err := os.Remove(alive); err != nil {
		t.Fatal(err)
	}
	testutil.WaitWithin(t, "the trainer to outlive the refused request", signalWait, func() bool {
		_, err := os.Stat(alive)
		return err == nil
	})
	ar.sigs <- syscall.SIGTERM
	if code := ar.waitExitWithin(t, signalWait); code != 128+int(syscall.SIGTERM) {
		t.Fatalf("exit code %d, want %d (the trainer stopped by SIGTERM)", code, 128+int(syscall.SIGTERM))
	}
	if n := signalled(t, logs, "SIGUSR1"); len(n) != 0 {
		t.Errorf("a trainer without a handler was signalled: %v", n)
	}
	// One line per refused request (the agent's), naming the missing
	// handler: no other entry of that request names it.
	ids := map[string]int{}
	for _, e := range refused() {
		m := e.ContextMap()
		if !strings.Contains(fmt.Sprint(m["error"]), "has no SIGUSR1 handler") {
			t.Errorf("refusal %v does not name the missing SIGUSR1 handler", m)
		}
		ids[fmt.Sprint(m["id"])] = 0
	}
	for _, e := range logs.All() {
		m := e.ContextMap()
		if _, ok := ids[fmt.Sprint(m["id"])]; ok && strings.Contains(fmt.Sprint(m), "has no SIGUSR1 handler") {
			ids[fmt.Sprint(m["id"])]++
		}
	}
	for id, n := range ids {
		if n != 1 {
			t.Errorf("request %s: %d log entries name the missing handler, want 1", id, n)
		}
	}
	noCommit(t, ar, logs)
}

// TestAgent_SignalFallbackTrainerDies: a trainer that dies of the shutdown
// request (its handler exits 3 without saving) fails the request at once,
// not at the deadline (TermGrace, 10 min): the agent exits with the
// trainer's 3 within a minute, logs the failure once, commits nothing,
// and asks nothing more of a trainer that is gone.
func TestAgent_SignalFallbackTrainerDies(t *testing.T) {
	ready := filepath.Join(testutil.ShortDir(t), "ready")
	core, logs := observer.New(zap.InfoLevel)
	ar := startAgent(t, func(c *Config) {
		c.Signal = syscall.SIGUSR1
		c.TermGrace = 10 * time.Minute
		c.Command = []string{"/bin/sh", "-c", `trap 'exit 3' USR1; touch ` + ready + `; while :; do sleep 0.05; done`}
		c.Log = zap.New(core)
	})
	testutil.WaitWithin(t, "the trainer's handler", signalWait, func() bool {
		_, err := os.Stat(ready)
		return err == nil
	})
	ar.sigs <- syscall.SIGTERM
	if code := ar.waitExitWithin(t, signalWait); code != 3 {
		t.Fatalf("exit code %d, want the trainer's 3", code)
	}
	if n := signalled(t, logs, "SIGUSR1"); len(n) != 1 {
		t.Errorf("trainer signalled for %v, want the shutdown request alone", n)
	}
	failed := logs.FilterMessage("trainer could not save the checkpoint").All()
	if len(failed) != 1 || failed[0].ContextMap()["error"] != "trainer exited before saving" {
		t.Fatalf("want one 'trainer could not save the checkpoint': 'trainer exited before saving', got %v", failed)
	}
	noCommit(t, ar, logs)
	for _, e := range logs.All() {
		if strings.Contains(fmt.Sprint(e.ContextMap()), "trainer not running") {
			t.Errorf("a request was sent after the trainer was gone: %s %v", e.Message, e.ContextMap())
		}
	}
}

// TestAgent_SignalFallbackNothingAskedWhileGone: the bridge stays
// connected while the trainer it speaks for is not running (here: exited
// 3, its restart an hour away), and then counts as no trainer: a SIGTERM
// meanwhile asks it nothing (no request, no "trainer not running") and
// ends the agent with 75. (TestAgent_SignalFallbackTrainerDies's
// trainer is gone only as the agent ends: nothing could ask it then.)
func TestAgent_SignalFallbackNothingAskedWhileGone(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	ar := startAgent(t, func(c *Config) {
		c.Signal = syscall.SIGUSR1
		c.MaxRestarts, c.RestartBackoff = 1, time.Hour // the SIGTERM comes during the backoff, whatever the load
		c.Command = []string{"/bin/sh", "-c", "exit 3"}
		c.Log = zap.New(core)
	})
	dumpOnFailure(t, "gone", func() string { return "(its output not kept)" }, logs)
	ar.waitStatus(t, "the trainer's exit and its restart pending", func(s Status) bool {
		return s.Child != nil && s.Child.Restarts == 1 && !s.Child.Running
	})
	ar.sigs <- syscall.SIGTERM
	if code := ar.waitExitWithin(t, signalWait); code != ExitInterrupted {
		t.Fatalf("exit code %d, want %d (interrupted before the trainer could restart)", code, ExitInterrupted)
	}
	if n := logs.FilterMessage("checkpoint requested").Len(); n != 0 {
		t.Errorf("%d checkpoints requested of a trainer that is not running", n)
	}
	for _, e := range logs.All() {
		if strings.Contains(fmt.Sprint(e.ContextMap()), "trainer not running") {
			t.Errorf("a request reached the bridge while the trainer was gone: %s %v", e.Message, e.ContextMap())
		}
	}
	noCommit(t, ar, logs)
}

package supervisor

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/schedule"
)

// What the real agent loop writes to the run's journal, and the goodput
// that `spotagent report` accounts from it (journal.Account), in runs the
// end-to-end tests once covered (#49 item 4).

// noTrainerWarning is what the agent says when a checkpoint falls due and
// no trainer ever connected, and nothing was ever committed.
const noTrainerWarning = "no trainer connected: checkpoints are not being taken, and an interruption now would lose everything: nothing was ever committed"

// runJournal reads the journal the agent wrote and checks it holds one
// session, ended.
func runJournal(t *testing.T, ar *agentRun) (*journal.Journal, journal.Session) {
	t.Helper()
	j, err := journal.Read(context.Background(), ar.store, ar.cfg.RunID)
	if err != nil || len(j.Sessions) != 1 || j.Sessions[0].End == nil || j.Sessions[0].ExitCode == nil {
		t.Fatalf("journal %+v, err %v: want one ended session", j, err)
	}
	return j, j.Sessions[0]
}

// TestAgent_NeverConnectedSaidAndUnprotected: a trainer that never
// connects (its environment lost SPOTAGENT_SOCKET: the Python client is
// then a no-op, python/tests test_client) is said when the first
// checkpoint falls due, once, naming the socket and the fix, and that
// nothing was ever committed. A stop then says nothing was ever committed
// (never "the previous checkpoint stands"), the agent exits 75, and the
// journal's session carries the unprotected time: its report has no
// goodput. (The end-to-end TestSilence_NeverConnects was cut in #49;
// TestSilence_NoTrainerRate holds the warning's repeats.)
func TestAgent_NeverConnectedSaidAndUnprotected(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	const iv = time.Second
	ar := startAgent(t, func(c *Config) {
		c.Command = []string{"/bin/sh", "-c", "sleep 60"} // never connects
		c.Scheduler = schedule.NewScheduler(schedule.SchedulerConfig{Fixed: iv})
		c.TermGrace = time.Second // the stop waits it for a trainer
		c.Log = zap.New(core)
	})
	testutil.WaitWithin(t, noTrainerWarning, iv+10*time.Second, func() bool { return logs.FilterMessage(noTrainerWarning).Len() > 0 })
	f := logs.FilterMessage(noTrainerWarning).All()[0].ContextMap()
	// Said when the first checkpoint fell due (one interval after the
	// start; slack for the loop's wake on a loaded machine), counted from
	// the session's start.
	if u, _ := f["unprotected_s"].(float64); u < 0.9*iv.Seconds() || u > iv.Seconds()+5 {
		t.Fatalf("warned after %.2f s unprotected, want within the loop's wake of the first checkpoint due (%v)", u, iv)
	}
	if fix, _ := f["fix"].(string); f["socket"] != ar.cfg.Server.Path || !strings.Contains(fix, "SPOTAGENT_SOCKET") {
		t.Fatalf("warning names socket %v, fix %q: want %s and SPOTAGENT_SOCKET", f["socket"], fix, ar.cfg.Server.Path)
	}
	if ever, ok := f["ever_committed"].(bool); !ok || ever {
		t.Fatalf("ever_committed=%v, want false", f["ever_committed"])
	}

	ar.sigs <- syscall.SIGTERM
	if code := ar.wait(t); code != ExitInterrupted {
		t.Fatalf("exit code %d, want %d", code, ExitInterrupted)
	}
	stop := logs.FilterMessage("interruption checkpoint did not commit: " + NothingCommitted).All()
	if len(stop) != 1 {
		t.Fatalf("%d lines say the stop committed nothing and nothing ever was, want 1", len(stop))
	}
	if _, ok := stop[0].ContextMap()["committed_step"]; ok {
		t.Fatalf("the stop claims a committed step: %v", stop[0].ContextMap())
	}
	if n := logs.FilterMessage("interruption checkpoint did not commit: the previous checkpoint stands").Len(); n != 0 {
		t.Fatalf("%d lines say the previous checkpoint stands: there was none", n)
	}
	if n := logs.FilterMessage(noTrainerWarning).Len(); n != 1 {
		t.Fatalf("%d warnings, want 1 (at once, then every %v)", n, warnEvery)
	}

	j, s := runJournal(t, ar)
	wall := s.End.Sub(s.Start).Seconds()
	if *s.ExitCode != ExitInterrupted || s.UnprotectedSeconds == nil || *s.UnprotectedSeconds < iv.Seconds() || *s.UnprotectedSeconds > wall+0.5 {
		t.Fatalf("journal session %+v (wall %.2f s): want exit %d and the unprotected time, from its start to its end", s, wall, ExitInterrupted)
	}
	if len(j.Interruptions) != 1 || j.Interruptions[0].CommitOK || !strings.Contains(j.Interruptions[0].Error, NothingCommitted) {
		t.Fatalf("journal interruptions %+v: want one, not committed, saying %q", j.Interruptions, NothingCommitted)
	}
	g, err := journal.Account(j, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if got := g.Seconds[journal.BucketProductive]; got > 0.5 {
		t.Fatalf("report: %.2f s productive, want none (nothing was ever protected): %v", got, g.Seconds)
	}
}

// TestAgent_NeverConnectedFinishedIsUnprotected: a trainer that never
// connected and finished on its own (exit 0) was never protected: the
// agent exits 0, the journal's session is finished and carries the
// trainer's time as unprotected, and its accounting counts that time as
// unprotected, not goodput (before, 100 %). cmd/spotagent
// TestReport_UnprotectedIsNoGoodput renders such a journal. (The
// end-to-end TestSilence_NeverConnectsFinishes was cut in #49.)
func TestAgent_NeverConnectedFinishedIsUnprotected(t *testing.T) {
	const iv, runs = 300 * time.Millisecond, 2 * time.Second
	ar := startAgent(t, func(c *Config) {
		c.Command = []string{"/bin/sh", "-c", "sleep 2"} // never connects, then finishes
		c.Scheduler = schedule.NewScheduler(schedule.SchedulerConfig{Fixed: iv})
	})
	if code := ar.wait(t); code != 0 {
		t.Fatalf("exit code %d, want 0 (the trainer finished)", code)
	}
	j, s := runJournal(t, ar)
	if *s.ExitCode != 0 || !s.Finished || s.UnprotectedSeconds == nil || *s.UnprotectedSeconds < runs.Seconds()-0.1 {
		t.Fatalf("journal session %+v: want exit 0, finished, unprotected the trainer's %v", s, runs)
	}
	g, err := journal.Account(j, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if got := g.Seconds[journal.BucketUnprotected]; got < runs.Seconds()-0.1 {
		t.Fatalf("report: %.2f s unprotected, want the trainer's %v: %v", got, runs, g.Seconds)
	}
	if got := g.Seconds[journal.BucketProductive]; got > g.Wall-(runs.Seconds()-0.1) {
		t.Fatalf("report: %.2f s productive of %.2f s wall, want the unprotected time left out: %v", got, g.Wall, g.Seconds)
	}
}

package supervisor

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/internal/testutil/noticetest"
	"github.com/spotagent/spotagent/internal/testutil/trainertest"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/schedule"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/localdirs"
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

// TestAgent_NotConnectedYetSaidBeforeAnyCheckpointIsDue: with the first
// checkpoint an hour away (the auto interval's first is about that), a
// trainer that has not connected ConnectWarnAfter after its start is
// warned of then, not an hour later; and its exit without ever
// connecting is said too.
func TestAgent_NotConnectedYetSaidBeforeAnyCheckpointIsDue(t *testing.T) {
	const notYet = "no trainer has connected yet: nothing is checkpointed until one does"
	core, logs := observer.New(zap.InfoLevel)
	done := filepath.Join(testutil.ShortDir(t), "done")
	ar := startAgent(t, func(c *Config) {
		// Never connects; exits 0 once the test has seen the warning.
		c.Command = []string{"/bin/sh", "-c", "while [ ! -e " + done + " ]; do sleep 0.05; done"}
		c.Scheduler = schedule.NewScheduler(schedule.SchedulerConfig{Fixed: time.Hour})
		c.ConnectWarnAfter = time.Second
		c.Log = zap.New(core)
	})
	testutil.WaitWithin(t, notYet, 30*time.Second, func() bool { return logs.FilterMessage(notYet).Len() > 0 })
	f := logs.FilterMessage(notYet).All()[0].ContextMap()
	if w, _ := f["waited_s"].(float64); w < 1 || f["socket"] != ar.cfg.Server.Path || !strings.Contains(f["fix"].(string), "SPOTAGENT_SOCKET") {
		t.Fatalf("warning %v: want waited_s ≥ 1, the socket and the fix", f)
	}
	testutil.WriteFile(t, done, "")
	if code := ar.wait(t); code != 0 {
		t.Fatalf("exit code %d, want 0 (the trainer finished)", code)
	}
	if n := logs.FilterMessage(notYet).Len(); n != 1 {
		t.Fatalf("said %d times, want once", n)
	}
	if n := logs.FilterMessage(noTrainerWarning).Len(); n != 0 {
		t.Fatalf("%d due-checkpoint warnings, want none: none fell due", n)
	}
	if n := logs.FilterMessage("the trainer exited without ever connecting: nothing of this session was checkpointed").Len(); n != 1 {
		t.Fatalf("its exit without a connection said %d times, want once", n)
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

// localCopies lists the local tier's and the restore area's files under
// the agent's area in dir (dir/<area>/{committed,restore}/*).
func localCopies(dir string) []string {
	var out []string
	for _, sub := range []string{localdirs.TierSub, localdirs.RestoreSub} {
		m, _ := filepath.Glob(filepath.Join(dir, "*", sub, "*"))
		out = append(out, m...)
	}
	return out
}

// TestAgent_FinishedRunRecordedSaidAndCacheCleared: a trainer finishes
// its work (step 60 reported, bye, exit 0) with the checkpoint directory
// the default cache. The journal records the session as finished, with
// the trainer's last step; the local copies under the default cache are
// deleted at the end (the store keeps them), the directory stays. A rerun
// on the same store says the run finished before, with the step, and
// resumes from the newest committed checkpoint. A checkpoint directory
// the user named keeps its copies. (The end-to-end
// TestFinishedRun_RecordedSaidAndCacheCleared, with the Python example
// trainer, was cut in #49.)
func TestAgent_FinishedRunRecordedSaidAndCacheCleared(t *testing.T) {
	cache := filepath.Join(testutil.ShortDir(t), "cache", "spotagent", "fin")
	release := filepath.Join(testutil.ShortDir(t), "release")
	var first *agentRun
	run := func(log *zap.Logger, defaultDir bool) *agentRun {
		return startAgent(t, func(c *Config) {
			c.RunID, c.CheckpointDir, c.DefaultCheckpointDir, c.LocalKeep = "fin", cache, defaultDir, 2
			c.Command = []string{"/bin/sh", "-c", "while [ ! -f " + release + " ]; do sleep 0.02; done"} // exits 0
			c.Log = log
			if first != nil {
				c.Store = first.store
			}
		})
	}
	finish := func(ar *agentRun, tr *trainertest.Trainer) {
		t.Helper()
		tr.Send(map[string]any{"type": "progress", "step": 60})
		tr.Send(map[string]any{"type": "bye", "step": 60})
		tr.Close()
		testutil.WriteFile(t, release, "")
		if code := ar.wait(t); code != 0 {
			t.Fatalf("finished run exit code %d, want 0", code)
		}
		os.Remove(release)
	}

	core, logs := observer.New(zap.InfoLevel)
	first = run(zap.New(core), true)
	tr := trainertest.Dial(t, first.cfg.Server.Path)
	tr.Hello()
	commitOwn(t, first, tr, "ck30", 30)
	if len(localCopies(cache)) == 0 {
		t.Fatalf("nothing kept in the local tier under %s: the test would prove nothing", cache)
	}
	finish(first, tr)
	const dropped = "run finished: deleted its local copies from the default cache directory (the store keeps the committed checkpoints, --keep of them)"
	if n := logs.FilterMessage(dropped).Len(); n != 1 {
		t.Fatalf("%d lines %q, want 1", n, dropped)
	}
	if left := localCopies(cache); len(left) > 0 {
		t.Fatalf("the finished run left %v under the default cache", left)
	}
	if _, err := os.Stat(cache); err != nil {
		t.Fatalf("the checkpoint dir itself is gone: %v", err)
	}
	j, err := journal.Read(context.Background(), first.store, "fin")
	if err != nil {
		t.Fatal(err)
	}
	if s := j.FinishedBefore(); s == nil || s.LastStep == nil || *s.LastStep != 60 {
		t.Fatalf("journal sessions %+v: want the last one finished at step 60", j.Sessions)
	}

	// The rerun trains again from the newest commit, and says why.
	core, logs = observer.New(zap.InfoLevel)
	again := run(zap.New(core), true)
	tr = trainertest.Dial(t, again.cfg.Server.Path)
	checkResume(t, again, tr.Hello().Resume, 30, "ck30")
	said := logs.FilterMessage("this run finished before: its trainer exited 0 after its work").All()
	if len(said) != 1 || said[0].ContextMap()["finished_step"] != int64(60) {
		t.Fatalf("rerun said %v, want once that the run finished before at step 60", said)
	}
	finish(again, tr)
	if left := localCopies(cache); len(left) > 0 {
		t.Fatalf("the finished rerun left %v under the default cache", left)
	}

	// A --checkpoint-dir the user named keeps them.
	named := run(zap.NewNop(), false)
	tr = trainertest.Dial(t, named.cfg.Server.Path)
	checkResume(t, named, tr.Hello().Resume, 30, "ck30")
	finish(named, tr)
	if len(localCopies(cache)) == 0 {
		t.Fatal("a finished run deleted the copies in a checkpoint directory the user named")
	}
}

// TestAgent_ThreeSessionsAccounted: one run through two spot notices, each
// followed by a new agent on the same store that restores, and a session
// whose trainer finishes. The journal the three agents wrote accounts
// (journal.Account, what `spotagent report` prints) to buckets that sum to
// the wall time, two interruptions with their notice checkpoints
// committed, two restores, three sessions, restore, between-machines and
// blocked time, and nothing missing. cmd/spotagent
// TestReport_ThreeSessionsJournal reports a real run's such journal.
// (The end-to-end TestGoodput_ThreeSessions was cut in #49.)
func TestAgent_ThreeSessionsAccounted(t *testing.T) {
	var first *agentRun
	dir := testutil.ShortDir(t)
	for i := range 3 {
		src := noticetest.New(1)
		release, exit := filepath.Join(dir, "release"+strconv.Itoa(i)), ExitInterrupted
		if i == 2 {
			exit = 0
		}
		ar := startAgent(t, func(c *Config) {
			c.Source = src
			// The trainer's process: it exits on its own once the test lets it.
			c.Command = []string{"/bin/sh", "-c", "while [ ! -f " + release + " ]; do sleep 0.02; done; exit " + strconv.Itoa(exit)}
			if first != nil {
				c.Store = first.store
			}
		})
		if first == nil {
			first = ar
		}
		tr := trainertest.Dial(t, ar.cfg.Server.Path)
		w := tr.Hello()
		if step := int64(100 * i); (i == 0) != (w.Resume == nil) || (w.Resume != nil && w.Resume.Step != step) {
			t.Fatalf("session %d: welcome resume %+v, want step %d", i+1, w.Resume, step)
		}
		if i < 2 {
			now := time.Now()
			src.C <- metadata.Notice{Cloud: metadata.CloudAWS, Kind: metadata.KindTermination, ID: "n" + strconv.Itoa(i),
				Detected: now, Deadline: now.Add(2 * time.Minute)}
			tr.Save(tr.Expect(protocol.TypeCheckpoint), int64(100*(i+1)), "w")
			tr.Expect(protocol.TypeCommitted)
			tr.Expect(protocol.TypeStop)
		} else {
			tr.Send(map[string]any{"type": "bye", "step": 250})
		}
		tr.Close()
		testutil.WriteFile(t, release, "")
		if code := ar.wait(t); code != exit {
			t.Fatalf("session %d: exit code %d, want %d", i+1, code, exit)
		}
	}
	j, err := journal.Read(context.Background(), first.store, first.cfg.RunID)
	if err != nil {
		t.Fatal(err)
	}
	g, err := journal.Account(j, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, s := range g.Seconds {
		sum += s
	}
	if g.Wall <= 0 || math.Abs(sum-g.Wall) > 0.01*g.Wall {
		t.Fatalf("buckets sum to %.3f s, wall %.3f s: want within 1 %%: %v", sum, g.Wall, g.Seconds)
	}
	if g.Interruptions != 2 || g.NoticeCommits != 2 || g.Restores != 2 || len(g.Sessions) != 3 {
		t.Fatalf("interruptions %d (notice committed %d), restores %d, sessions %d: want 2, 2, 2, 3",
			g.Interruptions, g.NoticeCommits, g.Restores, len(g.Sessions))
	}
	for _, b := range []string{journal.BucketRestore, journal.BucketBetween, journal.BucketBlocked} {
		if g.Seconds[b] <= 0 {
			t.Errorf("%s %v s, want > 0: %v", b, g.Seconds[b], g.Seconds)
		}
	}
	if len(g.Missing) != 0 {
		t.Fatalf("the agents' journal reported missing %q", g.Missing)
	}
	if !g.Sessions[0].NoticeOK || !g.Sessions[1].NoticeOK || g.Sessions[2].Interrupted || j.FinishedBefore() == nil {
		t.Fatalf("sessions %+v (journal %+v): want two ended by a committed notice checkpoint, the last finished", g.Sessions, j.Sessions)
	}
}

// TestAgent_RequestThatCannotBeSentIsNotAskedAtOnce: a checkpoint request
// whose directory cannot be made (here the agent's area is taken away;
// a full disk, a hostile co-tenant) is asked again 1 s later, then twice
// as long each time, not at every turn of the loop: a hostile-user trial
// saw 1,000 error lines a second at 87 % of a core. The gaps between the
// failures are read from the log's timestamps: a loaded machine can only
// widen them.
func TestAgent_RequestThatCannotBeSentIsNotAskedAtOnce(t *testing.T) {
	const failed = "cannot create checkpoint directory"
	core, logs := observer.New(zap.InfoLevel)
	ar := startAgent(t, func(c *Config) {
		c.Command = []string{"/bin/sh", "-c", "sleep 3600"}
		c.Scheduler = schedule.NewScheduler(schedule.SchedulerConfig{Fixed: 50 * time.Millisecond})
		// A request sent before the area goes is never answered: it
		// expires soon, and the next one is the first to fail.
		c.RequestTimeout = 200 * time.Millisecond
		c.Log = zap.New(core)
	})
	t.Cleanup(func() { ar.sigs <- syscall.SIGTERM; ar.wait(t) })
	tr := trainertest.Dial(t, ar.cfg.Server.Path)
	tr.Hello() // the start is over: its restore area is made
	if err := os.RemoveAll(filepath.Join(ar.cfg.CheckpointDir, localdirs.AreaPrefix+ar.cfg.RunID)); err != nil {
		t.Fatal(err)
	}
	testutil.WaitWithin(t, "three failed requests", time.Minute, func() bool { return logs.FilterMessage(failed).Len() >= 3 })
	es := logs.FilterMessage(failed).All()
	for i := 1; i < 3; i++ {
		gap := es[i].Time.Sub(es[i-1].Time)
		if want := time.Duration(1<<(i-1)) * time.Second; gap < want {
			t.Fatalf("failure %d came %s after the one before, want at least %s (%d failures so far)", i+1, gap, want, logs.FilterMessage(failed).Len())
		}
	}
}

package supervisor

import (
	"syscall"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/internal/testutil/trainertest"
	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/schedule"
)

// Issue 46 item 4: with two sidecars and one rank silent, a SIGTERM to a
// node exited 9 min 57 s later, when its periodic job commit (waiting for
// the silent node's part) reached its own 10-minute bound. A SIGTERM ends
// the agent within --term-grace (and the exit's bounded writes), whatever
// upload or job commit is pending: that work is given up.
func TestStop_SignalEndsWithinGraceWithJobCommitPending(t *testing.T) {
	const grace = 2 * time.Second
	// Node 0 of a two-node job (its rank 0 asks the job's periodic
	// checkpoints); node 1's agent runs (its part lease is taken, so the
	// job commit waits for its part) but its rank is silent.
	n1 := startAgent(t, func(c *Config) {
		c.Node = NodePart(0)
		c.TermGrace = grace
		c.Scheduler = schedule.NewScheduler(schedule.SchedulerConfig{Fixed: 50 * time.Millisecond})
	})
	t1 := trainertest.Dial(t, n1.cfg.Server.Path)
	helloRank(t1, 0)
	silent := startJobNode(t, n1, 1)
	helloRank(trainertest.Dial(t, silent.cfg.Server.Path), 1)
	req := t1.Expect(protocol.TypeCheckpoint)
	if req.Reason != protocol.ReasonPeriodic {
		t.Fatalf("first request %q, want periodic", req.Reason)
	}
	t1.Save(req, 3, "part of node 0")
	// Node 0's part is up; the job commit waits for node 1's, which never comes.
	n1.waitStatus(t, "the periodic job commit in flight", func(s Status) bool { return s.Uploading == 1 })

	sent := time.Now()
	n1.sigs <- syscall.SIGTERM
	// The shutdown's request goes unanswered: this rank is silent too now.
	if stop := t1.Expect(protocol.TypeCheckpoint); stop.Reason != protocol.ReasonShutdown {
		t.Fatalf("request after SIGTERM %q, want shutdown", stop.Reason)
	}
	// exitWait bounds the session's last writes after the loop.
	bound := grace + exitWait
	select {
	case code := <-n1.done:
		n1.done <- code
		if took := time.Since(sent); took > bound {
			t.Fatalf("exited %s after SIGTERM, want within %s (--term-grace %s)", took.Round(time.Millisecond), bound, grace)
		}
		t.Logf("exited %s after SIGTERM (--term-grace %s), code %d", time.Since(sent).Round(time.Millisecond), grace, code)
	case <-time.After(bound + testutil.Wait):
		t.Fatalf("still running %s after SIGTERM with --term-grace %s: the pending job commit held it", bound+testutil.Wait, grace)
	}
}

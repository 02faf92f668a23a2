package supervisor

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/spotagent/spotagent/internal/testutil"
	"github.com/spotagent/spotagent/internal/testutil/trainertest"
	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/schedule"
)

// TestFailureCause: the cause of a failed checkpoint is named from the
// agent's own error or from a trainer's failed text (the Python client's
// "ENOSPC: [Errno 28] ...", a bare OSError's "[Errno 13] ...", the
// strerror), and never from a word that merely contains a name.
func TestFailureCause(t *testing.T) {
	for _, c := range []struct {
		err  error
		text string
		want string
	}{
		{&os.PathError{Op: "mkdir", Path: "/x", Err: syscall.ENOSPC}, "", "ENOSPC"},
		{fmt.Errorf("commit: %w", &os.PathError{Op: "open", Path: "/x", Err: syscall.EACCES}), "", "EACCES"},
		{nil, "ENOSPC: [Errno 28] No space left on device: '/ckpt/x'", "ENOSPC"},
		{nil, "[Errno 13] Permission denied: '/ckpt/x'", "EACCES"},
		{nil, "write failed: read-only file system", "EROFS"},
		{nil, "disk quota exceeded", "EDQUOT"},
		{nil, "XENOSPCX happened", ""},
		{nil, "model too large", ""},
		{fmt.Errorf("plain"), "", ""},
	} {
		if got, fix := failureCause(c.err, c.text); got != c.want || (got != "" && fix == "") {
			t.Errorf("failureCause(%v, %q) = %q (fix %q), want %q with a fix", c.err, c.text, got, fix, c.want)
		}
	}
}

// TestSilence_NoTrainerRate: said at once when due, not again within
// warnEvery, again after it; the unprotected time runs from the last
// commit (or the start) until a trainer connects.
func TestSilence_NoTrainerRate(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	log := zap.New(core)
	var s silence
	t0 := time.Unix(1000, 0)
	v := silentView{socket: "/run/a.sock", since: t0.Add(-3 * time.Second)}
	s.noTrainer(true, t0, v, log)
	s.noTrainer(true, t0.Add(time.Minute), v, log)
	if n := logs.FilterMessageSnippet("no trainer connected").Len(); n != 1 {
		t.Fatalf("%d warnings within warnEvery, want 1", n)
	}
	if got, want := s.nextWake(nil, time.Minute, time.Minute), t0.Add(warnEvery); !got.Equal(want) {
		t.Fatalf("next wake %v, want %v", got, want)
	}
	s.noTrainer(true, t0.Add(warnEvery), v, log)
	if n := logs.FilterMessageSnippet("no trainer connected").Len(); n != 2 {
		t.Fatalf("%d warnings after warnEvery, want 2", n)
	}
	v.trainers = 1
	s.noTrainer(false, t0.Add(warnEvery+time.Second), v, log)
	if got, want := s.unprotectedSeconds(t0.Add(time.Hour)), (warnEvery + 4*time.Second).Seconds(); got != want {
		t.Fatalf("unprotected %v s, want %v s", got, want)
	}
	if logs.FilterMessage("a trainer connected: periodic checkpoints resume").Len() != 1 {
		t.Fatal("the trainer's return is not said")
	}
}

// TestSilence_NotYetConnected: a trainer awaited and not connected is
// said once, past the bound from when it was first awaited, with the
// socket and the fix; the loop is woken for it; a trainer no longer
// awaited (it connected, exited) restarts nothing and says nothing.
func TestSilence_NotYetConnected(t *testing.T) {
	const msg = "no trainer has connected yet: nothing is checkpointed until one does"
	core, logs := observer.New(zap.InfoLevel)
	log := zap.New(core)
	var s silence
	t0 := time.Unix(1000, 0)
	v := silentView{socket: "/run/a.sock", sidecar: true}
	s.notYet(true, t0, 2*time.Minute, v, log)
	if got, want := s.nextWake(nil, time.Minute, 2*time.Minute), t0.Add(2*time.Minute); !got.Equal(want) {
		t.Fatalf("next wake %v, want %v: the bound", got, want)
	}
	s.notYet(true, t0.Add(time.Minute), 2*time.Minute, v, log)
	if n := logs.FilterMessage(msg).Len(); n != 0 {
		t.Fatalf("said %d times within the bound, want 0", n)
	}
	s.notYet(true, t0.Add(2*time.Minute), 2*time.Minute, v, log)
	s.notYet(true, t0.Add(time.Hour), 2*time.Minute, v, log)
	said := logs.FilterMessage(msg).All()
	if len(said) != 1 {
		t.Fatalf("said %d times, want once", len(said))
	}
	f := said[0].ContextMap()
	if f["waited_s"] != 120.0 || f["socket"] != v.socket || !strings.Contains(f["fix"].(string), "SPOTAGENT_SOCKET=/run/a.sock") {
		t.Fatalf("fields %v: want waited_s 120, the socket and the sidecar's fix", f)
	}
	if got := s.nextWake(nil, time.Minute, 2*time.Minute); !got.IsZero() {
		t.Fatalf("next wake %v once said, want none", got)
	}
	var quiet silence
	quiet.notYet(true, t0, 2*time.Minute, v, log)
	quiet.notYet(false, t0.Add(time.Minute), 2*time.Minute, v, log) // it connected
	quiet.notYet(false, t0.Add(time.Hour), 2*time.Minute, v, log)
	if n := logs.FilterMessage(msg).Len(); n != 1 {
		t.Fatalf("a trainer that connected within the bound was warned of (%d warnings in all, want the first test's 1)", n)
	}
}

// TestUnansweredAfter: two intervals, at least 10 s and 4 saves.
func TestUnansweredAfter(t *testing.T) {
	for _, c := range []struct{ iv, save, want time.Duration }{
		{3 * time.Second, 0, 10 * time.Second},
		{time.Minute, time.Second, 2 * time.Minute},
		{time.Minute, time.Minute, 4 * time.Minute},
	} {
		if got := UnansweredAfter(c.iv, c.save); got != c.want {
			t.Errorf("UnansweredAfter(%s, %s) = %s, want %s", c.iv, c.save, got, c.want)
		}
	}
}

// TestAgent_DeafTrainerWarned: a trainer that never answers a periodic
// request is said within the stated bound (UnansweredAfter: here its 10 s
// floor, long before the request's own deadline): the loop wakes for it.
// The warning names the request, says nothing was ever committed and
// what to fix. (The end-to-end TestSilence_DeafTrainer was cut in #49;
// TestSilence_UnansweredRate holds the warning's repeats.)
func TestAgent_DeafTrainerWarned(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	ar := startAgent(t, func(c *Config) {
		c.Scheduler = schedule.NewScheduler(schedule.SchedulerConfig{Fixed: 100 * time.Millisecond})
		c.Log = zap.New(core)
	})
	tr := trainertest.Dial(t, ar.cfg.Server.Path)
	tr.Hello()
	req := tr.Expect(protocol.TypeCheckpoint) // never answered
	after := UnansweredAfter(100*time.Millisecond, 0)
	if req.Reason != protocol.ReasonPeriodic || req.Deadline == nil || req.Deadline.Before(time.Now().Add(2*after)) {
		t.Fatalf("request %+v, want a periodic one due long after %v", req, after)
	}
	const msg = "trainer has not answered the checkpoint request: an interruption now would lose everything: nothing was ever committed"
	testutil.WaitWithin(t, msg, after+5*time.Second, func() bool { return logs.FilterMessage(msg).Len() > 0 })
	e := logs.FilterMessage(msg).All()
	f := e[0].ContextMap()
	if len(e) != 1 || f["id"] != req.ID {
		t.Fatalf("warnings %v, want one of request %s", e, req.ID)
	}
	// Within the bound, and the loop's wake (slack for a loaded machine).
	if w, _ := f["waited_s"].(float64); w < after.Seconds() || w > after.Seconds()+5 {
		t.Fatalf("warned after %.1f s, want within %v of the request (and the loop's wake)", w, after)
	}
	if fix, _ := f["fix"].(string); !strings.Contains(fix, "agent.poll(step)") {
		t.Fatalf("fix %q: want it to say poll", fix)
	}
}

// TestSilence_UnansweredRate: an unanswered periodic request is said once
// it has waited the bound, not again within warnEvery, again after it;
// the loop's next wake is the moment it falls due, then the repeat's.
// Urgent requests are never said here (their deadline ends them).
func TestSilence_UnansweredRate(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	log := zap.New(core)
	var s silence
	t0 := time.Unix(1000, 0)
	after := 10 * time.Second
	reqs := map[string]*request{
		"r1":     {id: "r1", reason: protocol.ReasonPeriodic, sent: t0, waiting: map[uint64]bool{1: true}},
		"urgent": {id: "urgent", sent: t0, waiting: map[uint64]bool{1: true}, stop: &stopState{}},
	}
	v := silentView{trainers: 1}
	said := func() int { return logs.FilterMessageSnippet("trainer has not answered").Len() }
	if got := s.nextWake(reqs, after, time.Minute); !got.Equal(t0.Add(after)) {
		t.Fatalf("next wake %v, want %v", got, t0.Add(after))
	}
	if n := s.unanswered(reqs, after, t0.Add(after-time.Millisecond), v, log); n != 0 || said() != 0 {
		t.Fatalf("before the bound: %d overdue, %d said", n, said())
	}
	if n := s.unanswered(reqs, after, t0.Add(after), v, log); n != 1 || said() != 1 {
		t.Fatalf("at the bound: %d overdue, %d said, want 1 and 1", n, said())
	}
	if got := s.nextWake(reqs, after, time.Minute); !got.Equal(t0.Add(after + warnEvery)) {
		t.Fatalf("next wake %v, want the repeat's %v", got, t0.Add(after+warnEvery))
	}
	s.unanswered(reqs, after, t0.Add(after+warnEvery-time.Millisecond), v, log)
	if said() != 1 {
		t.Fatalf("%d warnings within warnEvery, want 1", said())
	}
	s.unanswered(reqs, after, t0.Add(after+warnEvery), v, log)
	if said() != 2 {
		t.Fatalf("%d warnings after warnEvery, want 2", said())
	}
	if e := logs.FilterMessageSnippet("trainer has not answered").All(); e[0].ContextMap()["id"] != "r1" || e[1].ContextMap()["id"] != "r1" {
		t.Fatalf("warnings %v, want r1's alone", e)
	}
}

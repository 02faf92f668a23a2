package agentsim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spotagent/spotagent/internal/child"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/childproc"
)

// Run mode under the simulation: the agent starts its trainer (Config's
// Child, a childproc.Starter) and the trainer it starts is a simulated
// process of the bubble (simProc): it connects as one trainer, answers as
// the hosted ones do, and exits with a code of its own at a drawn moment
// (before connecting, mid-save, after a done), honours or ignores the
// agent's SIGTERM, dies of its SIGKILL, and exits 75 (or 0, or a
// launcher's 1) once told to stop. The agent's exit code is checked
// against docs/protocol.md "Exit codes" (wantExit).

// simPIDBase is near the protocol's top pid (4194304, pid_max's most): no real
// process is likely to have a simulated pid
// (the agent asks /proc and kill(pid, 0) about its trainers' pids).
const simPIDBase = 4_190_000

// ownCodes are the codes a simulated trainer fails with on its own
// (never 1 nor 75, which mean more after a stop: docs/protocol.md).
var ownCodes = []int{2, 3, 7}

// starter is a session's childproc.Starter: each start is a new
// simulated process, its plan drawn from the seed, the session and how
// many starts came before (the agent starts them one at a time).
type starter struct {
	s  *session
	mu sync.Mutex
	ps []*simProc
}

func (st *starter) Start(cfg child.Config) (childproc.Child, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	w, s := st.s.w, st.s
	n := len(st.ps)
	for _, q := range st.ps {
		select {
		case <-q.done:
		default:
			w.violate("the agent started trainer %d while trainer %d still runs", n+1, q.n)
		}
	}
	r := rand.New(rand.NewPCG(w.seed, uint64(s.k*1000+n)))
	p := &simProc{w: w, s: s, n: n + 1, pid: simPIDBase + s.k*100 + n, done: make(chan struct{}), term: make(chan struct{}),
		startedAt: time.Now()}
	p.plan = pick(r, "crash", "finish", "run", "run", "run")
	if p.plan != "run" {
		p.exitAfter = time.Duration(r.IntN(150000)) * time.Millisecond
		if r.IntN(4) == 0 {
			p.exitAfter = time.Duration(r.IntN(5000)) * time.Millisecond // before it connects, likely
		}
	}
	p.ownCode = pick(r, ownCodes...)
	if p.plan == "finish" {
		p.ownCode = 0
	}
	p.stopCode = pick(r, 75, 75, 75, 0, 1)
	p.onTerm = pick(r, "exit143", "exit75", "exit0", "ignore")
	p.termDelay = time.Duration(r.IntN(3000)) * time.Millisecond
	// The trainer's own generator: it draws beside the process.
	tr := st.s.child.drawChild(rand.New(rand.NewPCG(w.seed, uint64(s.k*1000+n+500))), p)
	p.tr = tr
	st.ps = append(st.ps, p)
	w.logf("agent: starts trainer %d (pid %d): %s", p.n, p.pid, p.shape())
	go p.live()
	return p, nil
}

// procs is the trainers started so far.
func (st *starter) procs() []*simProc {
	st.mu.Lock()
	defer st.mu.Unlock()
	return slices.Clone(st.ps)
}

// simProc is one start of the trainer: a childproc.Child of the bubble.
type simProc struct {
	w         *world
	s         *session
	n         int // its start, from 1
	pid       int
	tr        *trainer
	startedAt time.Time

	plan      string        // crash, finish (on their own at exitAfter) or run (until told)
	exitAfter time.Duration // crash, finish: when it exits on its own
	ownCode   int           // crash: its code (finish: 0)
	stopCode  int           // its code once told to stop
	onTerm    string        // what the agent's SIGTERM does: exit143, exit75, exit0, ignore
	termDelay time.Duration // how long it takes to do it

	done     chan struct{}
	term     chan struct{} // closed at the agent's first SIGTERM
	termOnce sync.Once

	mu       sync.Mutex
	code     int
	ended    time.Time
	how      string    // own, stop, term, kill, restore
	gotStop  bool      // it read a stop message
	termAt   time.Time // the agent's first SIGTERM; zero: none
	restorer bool      // its start was told restore pending
}

func (p *simProc) shape() string {
	return fmt.Sprintf("plan=%s after=%s code=%d stop→%d term→%s; trainer at %s modes=%v", p.plan, p.exitAfter, p.ownCode, p.stopCode, p.onTerm, p.tr.connectAt, p.tr.modes)
}

// exit ends the process with code (once).
func (p *simProc) exit(code int, how string) {
	p.mu.Lock()
	if !p.ended.IsZero() {
		p.mu.Unlock()
		return
	}
	p.code, p.ended, p.how = code, time.Now(), how
	p.mu.Unlock()
	p.w.logf("trainer %d (pid %d) exits %d (%s)", p.n, p.pid, code, how)
	close(p.done)
}

// live is the process: its trainer, and its own end when its plan says.
func (p *simProc) live() {
	var wg sync.WaitGroup
	wg.Go(func() { p.tr.runChild(p) })
	if p.plan != "run" {
		t := time.NewTimer(p.exitAfter)
		select {
		case <-t.C:
			p.exit(p.ownCode, "own")
		case <-p.done:
		}
		t.Stop()
	}
	select {
	case <-p.term:
		p.onSIGTERM()
	case <-p.done:
	}
	wg.Wait()
}

func (p *simProc) onSIGTERM() {
	if p.onTerm == "ignore" {
		return // SIGKILL after KillAfter
	}
	t := time.NewTimer(p.termDelay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-p.done:
		return
	}
	switch p.onTerm {
	case "exit143":
		p.exit(128+int(syscall.SIGTERM), "term")
	case "exit75":
		p.exit(75, "term")
	case "exit0":
		p.exit(0, "term")
	}
}

func (p *simProc) PID() int              { return p.pid }
func (p *simProc) Done() <-chan struct{} { return p.done }
func (p *simProc) Close()                {}

func (p *simProc) ExitCode() int {
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.code
}

var errGone = errors.New("no such process")

func (p *simProc) Signal(sig syscall.Signal) error {
	select {
	case <-p.done:
		return errGone
	default:
	}
	switch sig {
	case syscall.SIGKILL:
		p.exit(128+int(syscall.SIGKILL), "kill")
	case syscall.SIGTERM:
		p.termOnce.Do(func() {
			p.mu.Lock()
			p.termAt = time.Now()
			p.mu.Unlock()
			p.w.logf("trainer %d: SIGTERM from the agent", p.n)
			close(p.term)
		})
	}
	return nil
}

// Stop is internal/child's: SIGTERM, SIGKILL after killAfter.
func (p *simProc) Stop(ctx context.Context, killAfter time.Duration) {
	if p.Signal(syscall.SIGTERM) != nil {
		return
	}
	t := time.NewTimer(killAfter)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		p.exit(128+int(syscall.SIGKILL), "kill")
	case <-ctx.Done():
	}
}

func (p *simProc) Kill(why string) { p.Signal(syscall.SIGKILL) }

// childPlan is what a run-mode session draws for its trainer.
type childPlan struct {
	maxRestarts int
	backoff     time.Duration
	overlap     bool
}

// drawChild draws the trainer of one start (its rank 0, alone).
func (c *childPlan) drawChild(r *rand.Rand, p *simProc) *trainer {
	tr := &trainer{s: p.s, w: p.w, rank: 0, n: 1, rng: r, connectAt: time.Duration(r.IntN(8000)) * time.Millisecond}
	tr.modes = []mode{prompt, prompt, prompt, slow}
	for range r.IntN(3) {
		tr.modes = append(tr.modes, pick(r, late, never, crash, failing, garbage))
	}
	return tr
}

// runChild is the trainer of process p: one connection, from its start
// to the process's end.
func (t *trainer) runChild(p *simProc) {
	t.proc = p
	if !t.sleep(t.connectAt, p.done) {
		return
	}
	t.serve()
}

// wantExit is the agent's exit code that docs/protocol.md "Exit codes"
// gives for what happened in session k (runErr: RunHostedChild's error):
// the codes allowed and why. signals are the times the host sent
// SIGTERMs (from the session's start), notice the notice's (-1: none);
// loopAt when the agent's loop ran (-1: never).
func (w *world) wantExit(k int, st *starter, plan *childPlan, runErr error, faults int, signals []time.Duration, notice, loopAt time.Duration, start time.Time) ([]int, string) {
	if runErr != nil {
		if strings.Contains(runErr.Error(), "start-up cancelled") || strings.Contains(runErr.Error(), "cancelled by") {
			if len(signals) == 0 {
				return nil, "start-up cancelled without a signal"
			}
			return []int{128 + int(syscall.SIGTERM)}, "a SIGTERM during the start (or its restore): 128+15"
		}
		if faults == 0 {
			return nil, "the agent failed without a store fault: " + runErr.Error()
		}
		return []int{1}, "the start (or the restore) failed on store faults: 1"
	}
	ps := st.procs()
	if len(ps) == 0 {
		return nil, "no trainer was started and no error"
	}
	last := ps[len(ps)-1]
	last.mu.Lock()
	code, how, ended, gotStop, termAt := last.code, last.how, last.ended, last.gotStop, last.termAt
	last.mu.Unlock()
	if ended.IsZero() {
		return nil, "the agent ended with its trainer still running"
	}
	at := ended.Sub(start)
	// The first stop the host caused (a signal or a notice), and a second
	// signal that counts (outside the signal window, the loop running).
	first := time.Duration(-1)
	for _, d := range append(slices.Clone(signals), notice) {
		if d >= 0 && (first < 0 || d < first) {
			first = d
		}
	}
	second := time.Duration(-1)
	if len(signals) > 1 && loopAt >= 0 && signals[1]-max(signals[0], loopAt) >= time.Second {
		second = signals[1]
	}
	restartsLeft := len(ps)-1 < plan.maxRestarts
	told := gotStop || !termAt.IsZero()
	switch {
	case how == "own" && told && code == 0:
		return []int{75}, "it exited 0 after a stop message or the agent's SIGTERM reached it: told to stop, 75"
	case how == "own" && told:
		return []int{code}, "it failed on its own after it was told to stop: its code"
	case how == "own" && code == 0:
		return []int{0}, "it finished (exit 0 before anything told it to stop): 0"
	case how == "own":
		if !restartsLeft {
			return []int{code}, "it failed on its own, no restart left: its code"
		}
		if first >= 0 && first <= at {
			return []int{code, 75}, "it failed on its own during a stop: its code (or 75: the stop reached the loop after the exit, during the backoff)"
		}
		if faults > 0 {
			return []int{75, code}, "it failed on its own, restarts left: a stop during the backoff or the restore is 75; a restore that failed on store faults ends with its code"
		}
		return []int{75}, "it failed on its own, restarts left, and no restart came: a stop during the backoff or the restore: 75"
	case how == "restore":
		if notice >= 0 {
			return []int{75}, "a termination notice during the restore beside its start: 75"
		}
		return nil, "its restore failed, yet the agent returned no error"
	case how == "stop":
		if code == 1 {
			return []int{1, 75}, "it exited 1 once told to stop: 75 when the stop's checkpoint committed (a launcher's 1), else 1"
		}
		return []int{75}, "it exited 0 or 75 once told to stop: 75"
	case how == "term" || how == "kill":
		if code == 0 || code == 75 {
			return []int{75}, "the agent stopped it and it exited 0 or 75: 75"
		}
		if second >= 0 && !termAt.IsZero() && termAt.Sub(start) >= second {
			return []int{code}, "a second signal stopped it at once: its code"
		}
		if last.restorer && gotStop == false {
			return []int{75, 1}, "stopped while its restore ran: 75 for a notice (a signal's 143 is an error), 1 when the restore failed"
		}
		return []int{75}, fmt.Sprintf("the agent stopped it at the stop's deadline: 75 (signals %v loop %s second %s term %s)", signals, loopAt, second, termAt.Sub(start))
	}
	return nil, "unknown end " + how
}

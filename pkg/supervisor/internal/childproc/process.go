// Package childproc is the trainer as the agent's child process: started,
// restarted after a failure of its own with backoff, stopped (SIGTERM,
// SIGKILL after KillAfter). The process itself and its group guard are
// internal/child.
package childproc

import (
	"context"
	"fmt"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/internal/child"
)

// Process is the trainer as the agent's child process: started, restarted
// after a failure of its own, stopped. The loop owns it and tells it what
// happened (Start, Exited, ExitAs, GiveUp, Stop); only PID is read beside
// the loop (the signal bridge).
type Process struct {
	cmd       []string
	killAfter time.Duration
	log       *zap.Logger
	starter   Starter

	child     Child
	pid       atomic.Int64    // for the signal bridge, which runs beside the loop
	done      <-chan struct{} // nil: not running
	restarts  int
	backoff   time.Duration // before the first restart, doubling
	restartAt time.Time     // zero: no restart pending
	exitCode  int           // the agent's exit code from the trainer's (ExitAs)
	gone      bool          // exited for good (or never had one)
	killing   bool          // child.Stop running
	// deadlineKill: the stop sequence's deadline passed with the trainer
	// still running, and the agent sent it SIGTERM (SIGKILL after KillAfter),
	// or zero-code mode signalled it to save: it may die of it.
	deadlineKill bool
}

// Exit is how the trainer ended, as the agent's exit code is decided
// from it (supervisor's exitCodeFor).
type Exit struct {
	Code int // its own exit code
	// Stopping: the agent was stopping it (Stop); DeadlineKill: the agent
	// signalled it at the stop's deadline, or to save (Signal): its death
	// by that signal is the stop it was told of.
	Stopping     bool
	DeadlineKill bool
}

// Starter starts the trainer's process. The agent's is internal/child's
// (Start, in its own process group with its guard) unless its Config
// names another: the agent's simulation (pkg/supervisor/internal/agentsim)
// starts trainers that live in its bubble.
type Starter interface {
	Start(cfg child.Config) (Child, error)
}

// Child is a started trainer as Process drives it: *child.Child's
// methods (see there).
type Child interface {
	PID() int
	Done() <-chan struct{}
	ExitCode() int // after Done
	Signal(sig syscall.Signal) error
	Stop(ctx context.Context, killAfter time.Duration)
	Kill(why string)
	Close()
}

// processes is the real Starter: internal/child.
type processes struct{}

func (processes) Start(cfg child.Config) (Child, error) { return child.Start(cfg) }

// New is the trainer cmd (none: the agent runs without a child), started
// by start (nil: a real process, internal/child); a restart waits backoff
// (0: 1s), doubling.
func New(cmd []string, killAfter, backoff time.Duration, start Starter, log *zap.Logger) *Process {
	if backoff <= 0 {
		backoff = time.Second
	}
	if start == nil {
		start = processes{}
	}
	return &Process{cmd: cmd, killAfter: killAfter, backoff: backoff, starter: start, log: log, gone: len(cmd) == 0}
}

// Running: a child was started and has not exited yet.
func (p *Process) Running() bool { return p.done != nil }

// Done is closed when the running child exits (nil: none running).
func (p *Process) Done() <-chan struct{} { return p.done }

// PID is the running child's pid (0: none). Safe beside the loop.
func (p *Process) PID() int { return int(p.pid.Load()) }

// Started: a child was started at least once.
func (p *Process) Started() bool { return p.child != nil }

// LastPID is the pid of the child started last (0: none was).
func (p *Process) LastPID() int {
	if p.child == nil {
		return 0
	}
	return p.child.PID()
}

// Restarts counts the restarts after failures of its own.
func (p *Process) Restarts() int { return p.restarts }

// Stopping: the agent is stopping it (SIGTERM sent, SIGKILL may follow).
func (p *Process) Stopping() bool { return p.killing }

// ExitCode is the agent's exit code from the trainer's (ExitAs; 0 until
// it exited).
func (p *Process) ExitCode() int { return p.exitCode }

// Gone: the trainer exited for good (or there never was one) and no
// restart is pending.
func (p *Process) Gone() bool { return p.gone && p.restartAt.IsZero() }

// RestartAt is when a pending restart is due (zero: none pending).
func (p *Process) RestartAt() time.Time { return p.restartAt }

// Start starts the trainer with env.
func (p *Process) Start(env []string) error {
	c, err := p.starter.Start(child.Config{Args: p.cmd, Env: env, Log: p.log})
	if err != nil {
		return fmt.Errorf("start trainer: %w", err)
	}
	p.child, p.done = c, c.Done()
	p.pid.Store(int64(c.PID()))
	p.log.Info("trainer started", zap.Int("pid", c.PID()), zap.Strings("command", p.cmd), zap.Int("restarts", p.restarts))
	return nil
}

// Exited takes the child's exit (after Done closed): its own code and
// whether the agent was stopping it. The stop in progress is over.
func (p *Process) Exited() Exit {
	e := Exit{Code: p.child.ExitCode(), Stopping: p.killing, DeadlineKill: p.deadlineKill}
	p.pid.Store(0) // the pid may be reused: nothing may signal it now
	p.done = nil
	p.killing = false
	return e
}

// ExitAs: the agent is to exit with code for the trainer's exit (the
// stop sequence's table, or the verdict of the crash-record lookup).
func (p *Process) ExitAs(code int) { p.exitCode = code }

// GiveUp: the trainer is not to be started again (it finished, was
// stopped, or could not be restored or restarted).
func (p *Process) GiveUp() { p.gone = true }

// RestartOrGiveUp schedules a restart of a trainer that failed on its own,
// with backoff, while maxRestarts allow; else it is gone for good.
func (p *Process) RestartOrGiveUp(code, maxRestarts int) {
	if p.restarts >= maxRestarts {
		p.gone = true
		if maxRestarts > 0 {
			p.log.Error("trainer failed and no restarts are left", zap.Int("code", code), zap.Int("restarts", p.restarts))
		}
		return
	}
	p.restarts++
	backoff := p.backoff << min(p.restarts-1, 6)
	p.restartAt = time.Now().Add(backoff)
	p.log.Warn("trainer failed: restarting from the newest committed checkpoint",
		zap.Int("code", code), zap.Int("restart", p.restarts), zap.Int("max_restarts", maxRestarts), zap.Duration("backoff", backoff))
}

// RestartDue: a restart is pending and its backoff has passed.
func (p *Process) RestartDue(now time.Time) bool {
	return !p.restartAt.IsZero() && !now.Before(p.restartAt)
}

// Restarting: the restart that was due begins; what the failed trainer
// left in its group goes first, so that it cannot run beside the new one.
func (p *Process) Restarting() {
	p.restartAt = time.Time{}
	p.Close()
}

// CancelRestart: a restart pending is not to happen; the trainer is gone.
func (p *Process) CancelRestart() {
	if !p.restartAt.IsZero() {
		p.restartAt = time.Time{}
		p.gone = true
	}
}

// Stop sends SIGTERM to the trainer's group, SIGKILL after killAfter, in
// a goroutine that goBg owns. Not cut short by the end of the agent's
// life (ctx without its cancel): the loop waits for the child's exit, and
// Stop is bounded by killAfter.
func (p *Process) Stop(ctx context.Context, goBg func(func())) {
	if p.child == nil || p.done == nil || p.killing {
		return
	}
	p.killing = true
	c, ctx := p.child, context.WithoutCancel(ctx)
	goBg(func() { c.Stop(ctx, p.killAfter) })
}

// Kill SIGKILLs the trainer's group, and what it started outside it, at
// once; why goes to the log. A Stop under way returns once the child's
// exit is seen.
func (p *Process) Kill(why string) {
	if p.child == nil || p.done == nil {
		return
	}
	p.child.Kill(why)
}

// StopAtDeadline stops a trainer still running when the stop sequence
// ends; its death by that signal is the stop it was told of.
func (p *Process) StopAtDeadline(ctx context.Context, goBg func(func())) bool {
	if p.done == nil || p.killing {
		return false
	}
	p.deadlineKill = true
	p.Stop(ctx, goBg)
	return true
}

// Signal sends sig to the trainer (zero-code mode asking it to save); it
// may die of it, and that death is the stop it was told of.
func (p *Process) Signal(sig syscall.Signal) error {
	if err := p.child.Signal(sig); err != nil {
		return err
	}
	p.deadlineKill = true
	return nil
}

// Finished: the trainer ran and exited 0 for good, and the agent exits 0
// (nothing told it to stop: its work is done).
func (p *Process) Finished() bool {
	return p.child != nil && p.done == nil && p.gone && p.child.ExitCode() == 0 && p.exitCode == 0
}

// Close takes down what the trainer left in its group.
func (p *Process) Close() {
	if p.child != nil {
		p.child.Close()
	}
}

// Package childproc is the trainer as the agent's child process: started,
// restarted after a failure of its own with backoff, stopped (SIGTERM,
// SIGKILL after KillAfter). The process itself and its group guard are
// internal/child.
package childproc

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/internal/child"
)

// Process is the trainer as the agent's child process: started, restarted
// after a failure of its own, stopped. The loop owns it; only pid is read
// beside the loop (the signal bridge).
type Process struct {
	cmd       []string
	killAfter time.Duration
	log       *zap.Logger

	Child     *child.Child
	PID       atomic.Int64    // for the signal bridge, which runs beside the loop
	Done      <-chan struct{} // nil: not running
	Restarts  int
	RestartAt time.Time // zero: no restart pending
	ExitCode  int       // the agent's exit code from the trainer's (supervisor's exitCodeFor)
	Gone      bool      // exited for good (or never had one)
	Killing   bool      // child.Stop running
	// DeadlineKill: the stop sequence's deadline passed with the trainer
	// still running, and the agent sent it SIGTERM (SIGKILL after KillAfter),
	// or zero-code mode signalled it to save: it may die of it.
	DeadlineKill bool
}

// New is the trainer cmd (none: the agent runs without a child).
func New(cmd []string, killAfter time.Duration, log *zap.Logger) *Process {
	return &Process{cmd: cmd, killAfter: killAfter, log: log, Gone: len(cmd) == 0}
}

// Running: a child was started and has not exited yet.
func (p *Process) Running() bool { return p.Done != nil }

// Start starts the trainer with env.
func (p *Process) Start(env []string) error {
	c, err := child.Start(child.Config{Args: p.cmd, Env: env, Log: p.log})
	if err != nil {
		return fmt.Errorf("start trainer: %w", err)
	}
	p.Child, p.Done = c, c.Done()
	p.PID.Store(int64(c.PID()))
	p.log.Info("trainer started", zap.Int("pid", c.PID()), zap.Strings("command", p.cmd), zap.Int("restarts", p.Restarts))
	return nil
}

// Exited takes the child's exit (after done closed): its own code.
// Killing still says whether the agent was stopping it (supervisor's
// exitCodeFor reads it); the caller clears it after.
func (p *Process) Exited() int {
	code := p.Child.ExitCode()
	p.PID.Store(0) // the pid may be reused: nothing may signal it now
	p.Done = nil
	return code
}

// RestartOrGiveUp schedules a restart of a trainer that failed on its own,
// with backoff, while maxRestarts allow; else it is gone for good.
func (p *Process) RestartOrGiveUp(code, maxRestarts int) {
	if p.Restarts >= maxRestarts {
		p.Gone = true
		if maxRestarts > 0 {
			p.log.Error("trainer failed and no restarts are left", zap.Int("code", code), zap.Int("restarts", p.Restarts))
		}
		return
	}
	p.Restarts++
	backoff := time.Second << min(p.Restarts-1, 6)
	p.RestartAt = time.Now().Add(backoff)
	p.log.Warn("trainer failed: restarting from the newest committed checkpoint",
		zap.Int("code", code), zap.Int("restart", p.Restarts), zap.Int("max_restarts", maxRestarts), zap.Duration("backoff", backoff))
}

// RestartDue: a restart is pending and its backoff has passed.
func (p *Process) RestartDue(now time.Time) bool {
	return !p.RestartAt.IsZero() && !now.Before(p.RestartAt)
}

// CancelRestart: a restart pending is not to happen; the trainer is gone.
func (p *Process) CancelRestart() {
	if !p.RestartAt.IsZero() {
		p.RestartAt = time.Time{}
		p.Gone = true
	}
}

// Stop sends SIGTERM to the trainer's group, SIGKILL after killAfter, in
// a goroutine that goBg owns. Not cut short by the end of the agent's
// life (ctx without its cancel): the loop waits for the child's exit, and
// Stop is bounded by killAfter.
func (p *Process) Stop(ctx context.Context, goBg func(func())) {
	if p.Child == nil || p.Done == nil || p.Killing {
		return
	}
	p.Killing = true
	c, ctx := p.Child, context.WithoutCancel(ctx)
	goBg(func() { c.Stop(ctx, p.killAfter) })
}

// Kill SIGKILLs the trainer's group, and what it started outside it, at
// once; why goes to the log. A Stop under way returns once the child's
// exit is seen.
func (p *Process) Kill(why string) {
	if p.Child == nil || p.Done == nil {
		return
	}
	p.Child.Kill(why)
}

// StopAtDeadline stops a trainer still running when the stop sequence
// ends; its death by that signal is the stop it was told of.
func (p *Process) StopAtDeadline(ctx context.Context, goBg func(func())) bool {
	if p.Done == nil || p.Killing {
		return false
	}
	p.DeadlineKill = true
	p.Stop(ctx, goBg)
	return true
}

// Close takes down what the trainer left in its group.
func (p *Process) Close() {
	if p.Child != nil {
		p.Child.Close()
	}
}

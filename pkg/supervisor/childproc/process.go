package childproc

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/internal/child"
)

// process is the trainer as the agent's child process: started, restarted
// after a failure of its own, stopped. The loop owns it; only pid is read
// beside the loop (the signal bridge).
type process struct {
	cmd       []string
	killAfter time.Duration
	log       *zap.Logger

	c         *child.Child
	pid       atomic.Int64    // for the signal bridge, which runs beside the loop
	done      <-chan struct{} // nil: not running
	restarts  int
	restartAt time.Time // zero: no restart pending
	exitCode  int       // the agent's exit code from the trainer's (exitCodeFor)
	gone      bool      // exited for good (or never had one)
	killing   bool      // child.Stop running
	// deadlineKill: the stop sequence's deadline passed with the trainer
	// still running, and the agent sent it SIGTERM (SIGKILL after KillAfter),
	// or zero-code mode signalled it to save: it may die of it.
	deadlineKill bool
}

func newProcess(cmd []string, killAfter time.Duration, log *zap.Logger) *process {
	return &process{cmd: cmd, killAfter: killAfter, log: log, gone: len(cmd) == 0}
}

// running: a child was started and has not exited yet.
func (p *process) running() bool { return p.done != nil }

// start starts the trainer with env.
func (p *process) start(env []string) error {
	c, err := child.Start(child.Config{Args: p.cmd, Env: env, Log: p.log})
	if err != nil {
		return fmt.Errorf("start trainer: %w", err)
	}
	p.c, p.done = c, c.Done()
	p.pid.Store(int64(c.PID()))
	p.log.Info("trainer started", zap.Int("pid", c.PID()), zap.Strings("command", p.cmd), zap.Int("restarts", p.restarts))
	return nil
}

// exited takes the child's exit (after done closed): its own code.
// killing still says whether the agent was stopping it (exitCodeFor
// reads it); the caller clears it after.
func (p *process) exited() int {
	code := p.c.ExitCode()
	p.pid.Store(0) // the pid may be reused: nothing may signal it now
	p.done = nil
	return code
}

// restartOrGiveUp schedules a restart of a trainer that failed on its own,
// with backoff, while maxRestarts allow; else it is gone for good.
func (p *process) restartOrGiveUp(code, maxRestarts int) {
	if p.restarts >= maxRestarts {
		p.gone = true
		if maxRestarts > 0 {
			p.log.Error("trainer failed and no restarts are left", zap.Int("code", code), zap.Int("restarts", p.restarts))
		}
		return
	}
	p.restarts++
	backoff := time.Second << min(p.restarts-1, 6)
	p.restartAt = time.Now().Add(backoff)
	p.log.Warn("trainer failed: restarting from the newest committed checkpoint",
		zap.Int("code", code), zap.Int("restart", p.restarts), zap.Int("max_restarts", maxRestarts), zap.Duration("backoff", backoff))
}

// restartDue: a restart is pending and its backoff has passed.
func (p *process) restartDue(now time.Time) bool {
	return !p.restartAt.IsZero() && !now.Before(p.restartAt)
}

// cancelRestart: a restart pending is not to happen; the trainer is gone.
func (p *process) cancelRestart() {
	if !p.restartAt.IsZero() {
		p.restartAt = time.Time{}
		p.gone = true
	}
}

// stop sends SIGTERM to the trainer's group, SIGKILL after killAfter, in
// a goroutine that goBg owns. Not cut short by the end of the agent's
// life (ctx without its cancel): the loop waits for the child's exit, and
// Stop is bounded by killAfter.
func (p *process) stop(ctx context.Context, goBg func(func())) {
	if p.c == nil || p.done == nil || p.killing {
		return
	}
	p.killing = true
	c, ctx := p.c, context.WithoutCancel(ctx)
	goBg(func() { c.Stop(ctx, p.killAfter) })
}

// stopAtDeadline stops a trainer still running when the stop sequence
// ends; its death by that signal is the stop it was told of.
func (p *process) stopAtDeadline(ctx context.Context, goBg func(func())) bool {
	if p.done == nil || p.killing {
		return false
	}
	p.deadlineKill = true
	p.stop(ctx, goBg)
	return true
}

// close takes down what the trainer left in its group.
func (p *process) close() {
	if p.c != nil {
		p.c.Close()
	}
}

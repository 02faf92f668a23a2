package supervisor

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/supervisor/bootrestore"
	"github.com/spotagent/spotagent/pkg/supervisor/localdirs"
)

// The restore beside the trainers (pkg/supervisor/bootrestore: the
// overlapped restore at the start, a trainer back after a commit): the
// agent's one Boot (Agent.boot), driven from the loop. What it needs of
// the agent's other owners is here.

// openRestores sets up the agent's one owner of restores (Agent.boot):
// every restore fetches with the source's fetch (sr) and the options
// built here, once (the lease is taken: its epoch bounds what a restore
// may pick), and is recorded by the one record below.
func (a *Agent) openRestores(sr sourceRestore) {
	opts := a.commits.restoreOptions(a.job.restorePart(), a.log)
	a.boot = bootrestore.New(bootrestore.Env{Life: a.life, GoBgFail: a.goBgFail, Log: a.log, Errs: func() { a.cfg.Metrics.Error("restore") },
		NoRejoin: a.cfg.Watch != nil, // zero-code mode: a trainer back resumes what its directory holds
		Fetch:    func(ctx context.Context) (*localdirs.Fetched, error) { return sr.fetch(ctx, opts) },
		Record: func(f *localdirs.Fetched) *protocol.Resume {
			var r *protocol.Resume
			if f != nil {
				r = a.commits.restored(f, a.sess, a.cfg.Metrics, a.cfg.Node) // commits.go
			}
			if sr.restored != nil {
				sr.restored(f, a.proc.Started())
			}
			return r
		},
		Hand:  func(r *protocol.Resume, c *protocol.Conn) { a.dirs.handRestore(a.log, r, c) },
		Admit: func(ev protocol.Event, r *protocol.Resume) { a.admit(ev.Conn, ev.Msg, a.cfg.Welcome(ev.Msg, r)) }})
}

// onRestoreDone: the overlapped restore ended; the trainers learn how.
func (a *Agent) onRestoreDone(res bootrestore.Result) {
	p, err, ok := a.boot.Ended(res, a.log, func() { a.cfg.Metrics.Error("restore") })
	if err != nil {
		a.proc.CancelRestart() // it exited meanwhile: no restart
		if a.proc.Running() {
			// It was told: it should exit with the error itself.
			a.boot.StopTrainerAt(time.Now().Add(a.cfg.KillAfter))
		}
	}
	if !ok {
		return
	}
	a.sess.RecordSession(a.cfg.Identity)
	a.cfg.Metrics.Ready(true)
	p.Restored(a.boot.Resume(), a.log, func(r *protocol.Resume, c *protocol.Conn) { a.dirs.handRestore(a.log, r, c) },
		func(ev protocol.Event) { a.onHello(ev.Conn, ev.Msg) })
}

// abortStart gives the start up while the restore runs (a signal or a
// termination notice): the restore is cancelled, its partial directory
// removed, and the trainer, which has not resumed and has nothing to save,
// is stopped. True when there was a restore to abort.
func (a *Agent) abortStart(why string, ab *bootrestore.Abort) bool {
	if !a.boot.Abort(why, ab) {
		return false
	}
	a.proc.CancelRestart() // it exited meanwhile: no restart
	a.log.Warn("start given up during the restore: cancelling it and stopping the trainer (it has not resumed: nothing to save)", zap.String("why", why))
	a.proc.Stop(a.life, a.goBg)
	return true
}

// restarted: a restart's restore ended (res): the trainer starts again
// from it, or, when it failed, is given up (the agent exits with its last
// code); one cancelled by a stop was given up then (onNotice).
func (a *Agent) restarted(res bootrestore.Result) {
	start, err := a.boot.OnRestarted(res)
	if err != nil {
		a.proc.GiveUp()
	}
	if !start {
		return
	}
	if err := a.startChild(); err != nil {
		a.log.Error("restart failed", zap.Error(err))
		a.proc.GiveUp()
	}
}

// committed is the newest committed checkpoint as the rejoin restore
// asks for it (pkg/supervisor/bootrestore).
func (c *commits) committed() bootrestore.Committed {
	return bootrestore.Committed{ID: c.last.id, Step: c.last.step}
}

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

// startRestore runs the restore beside the loop; its end reaches the loop
// through boot.Done.
func (a *Agent) startRestore() {
	opts := a.commits.restoreOptions(a.job.restorePart(), a.log)
	a.log.Info("restoring while the trainer starts")
	a.boot.StartBeside(a.life, a.goBgFail, func(ctx context.Context) (*localdirs.Fetched, error) {
		return a.dirs.FetchRestore(ctx, a.cfg.Store, opts, a.log)
	})
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
	if res.Fetched != nil {
		f := res.Fetched
		a.boot.Resumed(a.commits.restored(f.R, f.Start, f.R.Dir, f.Manifest, a.sess, a.cfg.Metrics, a.cfg.Node))
		a.commits.resumed(time.Now())
	}
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

// committed is the newest committed checkpoint as the rejoin restore
// asks for it (pkg/supervisor/bootrestore).
func (c *commits) committed() bootrestore.Committed {
	return bootrestore.Committed{ID: c.last.id, Step: c.last.step}
}

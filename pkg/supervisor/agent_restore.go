package supervisor

import (
	"context"
	"fmt"
	"os"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/supervisor/localdirs"
	"github.com/spotagent/spotagent/pkg/supervisor/sigrelay"
)

// bootRestore is the restore at the start: the resume the trainers are
// told of, and the restore running beside the trainer's start (restoring);
// aborted: the start was given up meanwhile; gone: why the trainers will
// get no resume (it failed or was cancelled); abandonAt: when a trainer
// told of a failed restore is stopped.
type bootRestore struct {
	resume    *protocol.Resume
	restoring *pendingRestore
	// agent_rejoin.go: the restore for a trainer back after a commit (its
	// done nil while it waits for the uploads in flight), the commit it
	// last restored for, the trainers connected at its hello, its needs
	rejoin          *pendingRestore
	rejoinFor       string
	rejoinConnected int
	env             rejoinEnv
	aborted         *startAbort
	gone            string
	abandonAt       time.Time
}

// The overlapped restore (Config.OverlapRestore): the trainer starts at
// once and the restore runs beside the loop, so that a new machine pays
// max(restore, trainer boot) rather than their sum. What the trainer learns,
// and when (docs/protocol.md, "Restore while the trainer starts"):
//
//   - a protocol 2 hello is welcomed at once with restore "pending"; the
//     restore's end follows as restored {resume} (no resume: a definite
//     fresh start) or restore_failed {error};
//   - a protocol 1 hello (an older client) is held: its welcome, with the
//     resume, is sent when the restore ends, as if the restore had run
//     first; a failed restore answers it with a permanent error;
//   - the environment says SPOTAGENT_RESUME=pending instead of
//     SPOTAGENT_RESUME_DIR, and gives an older Python client's connect a
//     long SPOTAGENT_WELCOME_TIMEOUT, so that it waits for its welcome.
//
// No checkpoint is asked for until the restore ended (trainers() is 0): a
// trainer that has not resumed has nothing worth saving. A signal or a
// termination notice meanwhile cancels the restore (its partial directory
// goes), tells the trainers, and stops the trainer: nothing is saved, the
// newest committed checkpoint stays what the next start resumes from. A
// failed restore stops the trainer after KillAfter (it was told, and should
// exit with the error itself) and the agent exits 1 with the error.

// pendingRestore is the restore running beside the loop; the loop owns it.
type pendingRestore struct {
	cancel  context.CancelFunc
	done    chan restoreResult
	held    []protocol.Event          // protocol 1 hellos waiting for it
	waiting map[uint64]*protocol.Conn // protocol 2 trainers told "pending"
	why     string                    // cancelled: why (a signal, a notice, no trainer left)
}

type restoreResult struct {
	f   *localdirs.Fetched
	err error
}

// startAbort is why the start was given up while the restore ran.
type startAbort struct {
	sig    os.Signal // a signal: exit 128+N, as a cancelled start
	notice bool      // a termination notice: exit 75, run me again
	err    error     // the restore failed: exit 1 with it
}

// startRestore runs the restore beside the loop; its end reaches the loop
// through restoreDone.
func (a *Agent) startRestore() {
	opts := a.commits.restoreOptions(a.job.restorePart(), a.log)
	a.log.Info("restoring while the trainer starts")
	a.boot.restoring = restoreBeside(a.life, a.goBgFail, func(ctx context.Context) (*localdirs.Fetched, error) {
		return a.dirs.FetchRestore(ctx, a.cfg.Store, opts, a.log)
	})
}

// restoreBeside runs fetch in a goroutine of the agent (goBgFail) and
// returns it as a pendingRestore: its end comes on done.
func restoreBeside(life context.Context, goBgFail func(func(), func(error)), fetch func(context.Context) (*localdirs.Fetched, error)) *pendingRestore {
	ctx, cancel := context.WithCancel(life)
	p := &pendingRestore{cancel: cancel, done: make(chan restoreResult, 1), waiting: map[uint64]*protocol.Conn{}}
	goBgFail(func() {
		defer cancel()
		f, err := fetch(ctx)
		p.done <- restoreResult{f: f, err: err}
	}, func(err error) { p.done <- restoreResult{err: fmt.Errorf("restore: %w", err)} })
	return p
}

// onRestoreDone: the overlapped restore ended; the trainers learn how.
func (a *Agent) onRestoreDone(res restoreResult) {
	p := a.boot.restoring
	a.boot.restoring = nil
	switch {
	case p.why != "":
		if res.f != nil {
			a.log.Info("restore finished after the start was given up: not used", zap.String("why", p.why))
		}
		a.boot.gone = "restore cancelled: " + p.why
		p.tellFailed(a.boot.gone)
		return
	case res.err != nil:
		err := res.err // "restore: ..." (localdirs.FetchRestore)
		a.log.Error("restore failed: the trainer is told and stopped; the agent exits 1", zap.Error(err))
		a.cfg.Metrics.Error("restore")
		a.boot.aborted = &startAbort{err: err}
		a.boot.gone = err.Error()
		p.tellFailed(err.Error())
		a.proc.CancelRestart() // it exited meanwhile: no restart
		if a.proc.Done != nil {
			// It was told: it should exit with the error itself.
			a.boot.abandonAt = time.Now().Add(a.cfg.KillAfter)
		}
		return
	}
	a.sess.RecordSession(a.cfg.Identity)
	a.cfg.Metrics.Ready(true)
	if res.f != nil {
		a.boot.resume = a.commits.restored(res.f.R, res.f.Start, res.f.R.Dir, res.f.Manifest, a.sess, a.cfg.Metrics, a.cfg.Node)
		now := time.Now()
		a.commits.lastBlock = now
		a.commits.last.trainedAt = now
	}
	for _, c := range p.waiting {
		a.dirs.handRestore(a.log, a.boot.resume, c) // dirs.go
		if err := c.Post(protocol.Message{Type: protocol.TypeRestored, Resume: a.boot.resume}); err != nil {
			a.log.Warn("restored not delivered", zap.Uint64("conn", c.ID()), zap.Error(err))
		}
	}
	for _, ev := range p.held {
		a.onHello(ev.Conn, ev.Msg)
	}
}

// abortStart gives the start up while the restore runs (a signal or a
// termination notice): the restore is cancelled, its partial directory
// removed, and the trainer, which has not resumed and has nothing to save,
// is stopped. True when there was a restore to abort.
func (a *Agent) abortStart(why string, ab *startAbort) bool {
	p := a.boot.restoring
	if p == nil {
		return false
	}
	if a.boot.aborted == nil {
		a.boot.aborted = ab
	}
	a.proc.CancelRestart() // it exited meanwhile: no restart
	p.why = why
	p.cancel()
	a.log.Warn("start given up during the restore: cancelling it and stopping the trainer (it has not resumed: nothing to save)", zap.String("why", why))
	a.proc.Stop(a.life, a.goBg)
	return true
}

// done is the loop's source of the restore's end (nil: none running).
func (b *bootRestore) done() <-chan restoreResult {
	if b.restoring == nil {
		return nil
	}
	return b.restoring.done
}

// exit is Run's answer after a start given up during the restore
// (ok false: none was).
func (b *bootRestore) exit() (code int, err error, ok bool) {
	ab := b.aborted
	switch {
	case ab == nil:
		return 0, nil, false
	case ab.sig != nil:
		code, err = sigrelay.StartCancelled(ab.sig)
		return code, err, true
	case ab.notice:
		return ExitInterrupted, nil, true
	}
	return 1, ab.err, true
}

// forget drops a connection that closed from the restores' waiters.
func (b *bootRestore) forget(id uint64) {
	b.rejoin.forget(id)
	b.restoring.forget(id)
}

// forget drops a connection that closed from p's waiters (p may be nil).
func (p *pendingRestore) forget(id uint64) {
	if p == nil {
		return
	}
	delete(p.waiting, id)
	for i, ev := range p.held {
		if ev.Conn.ID() == id {
			p.held = append(p.held[:i], p.held[i+1:]...)
			break
		}
	}
}

// tellFailed tells the trainers waiting for the restore that it
// will not come: restore_failed, or to a held hello a permanent refusal.
func (p *pendingRestore) tellFailed(why string) {
	for _, c := range p.waiting {
		c.Post(protocol.Message{Type: protocol.TypeRestoreFailed, Error: why})
	}
	for _, ev := range p.held {
		ev.Conn.SendNoWait(protocol.Message{Type: protocol.TypeError, Error: "run could not start: " + why}, true)
	}
}

// hello answers a hello while the restore runs or after it
// failed; false: the restore is over and ok, the hello is served as usual.
func (b *bootRestore) hello(ev protocol.Event, cfg *Config) (welcome *protocol.Message, handled bool) {
	c, m := ev.Conn, ev.Msg
	failed := b.gone
	p := b.restoring
	if p == nil {
		p = b.rejoin // agent_rejoin.go: a trainer back after a commit
	}
	if failed == "" && p == nil {
		return nil, false
	}
	if m.Version < 2 {
		if failed != "" {
			c.SendNoWait(protocol.Message{Type: protocol.TypeError, Error: "run could not start: " + failed}, true)
			return nil, true
		}
		cfg.Log.Info("trainer connected (protocol 1): its welcome waits for the restore", zap.Uint64("conn", c.ID()), zap.Int("pid", m.PID))
		p.held = append(p.held, ev)
		return nil, true
	}
	w := cfg.Welcome(m, b.resume)
	if failed != "" {
		w.Restore, w.Error = protocol.RestoreFailed, failed
	} else {
		w.Restore, w.Resume = protocol.RestorePending, nil // a trainer back after a commit: not the older one
		p.waiting[c.ID()] = c
	}
	return &w, true
}

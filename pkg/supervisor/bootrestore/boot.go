// Package bootrestore is the agent's one owner of every restore (Boot):
// the start's (before the trainer starts, or while it starts: the
// overlapped restore, Config.OverlapRestore), a restart's (restart.go) and
// the one for a trainer back after a commit (rejoin.go). Every restore but
// the serial start's runs beside the loop, so that a signal or a notice
// meanwhile is handled at once; each fetches with the one Env.Fetch and is
// recorded by the one Env.Record. The hellos meanwhile (held and pending
// welcomes), restored and restore_failed, and a start given up meanwhile
// are here too. The agent (pkg/supervisor's agent_restore.go) owns one
// Boot and drives it from its loop; what it needs of the agent comes in as
// values and functions.
package bootrestore

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

// Boot is the agent's restores: the resume the trainers are told of, the
// start's restore running beside the trainer's start (restoring), a
// restart's (restart) and a rejoin's (rejoin); aborted: the start was
// given up meanwhile; gone: why the trainers will get no resume (the
// start's restore failed or was cancelled); abandonAt: when a trainer told
// of a failed restore is stopped. The loop tells it what happened
// (RestoreNow, StartBeside, Ended, Abort, StartRestart, CancelRestart,
// OnRestarted, TrainerExited, Hello, ...) and asks it (Resume, Restoring,
// Restarting, Busy, Failed, Aborted, AbandonDue).
type Boot struct {
	resume    *protocol.Resume
	restoring *Pending
	restart   *Pending // restart.go: a restart's restore
	// rejoin.go: the restore for a trainer back after a commit (its
	// done nil while it waits for the uploads in flight), the commit it
	// last restored for, the trainers connected at its hello, its needs
	rejoin          *Pending
	rejoinFor       string
	rejoinConnected int
	env             Env
	aborted         *Abort
	gone            string
	abandonAt       time.Time
}

// New is the owner of the agent's restores with what it needs of the
// agent (env).
func New(env Env) Boot { return Boot{env: env} }

// RestoreNow is the serial start's restore (--restore-serial, or a trainer
// that cannot wait: the signal fallback's, zero-code mode's): before the
// trainer starts and before the loop runs, under ctx, which a signal
// during the start cancels (pkg/supervisor/sigrelay).
func (b *Boot) RestoreNow(ctx context.Context) error {
	f, err := b.env.Fetch(ctx)
	if err != nil {
		return err
	}
	b.resume = b.env.Record(f)
	return nil
}

// Resume is what the trainers are told to resume (nil: a fresh start).
func (b *Boot) Resume() *protocol.Resume { return b.resume }

// Restoring: the start's restore runs beside the trainer's start.
func (b *Boot) Restoring() bool { return b.restoring != nil }

// Busy: a restore runs beside the loop (the start's, a restart's), or a
// trainer back after a commit waits for its own: one at a time, each
// clears the restore area.
func (b *Boot) Busy() bool { return b.restoring != nil || b.rejoin != nil || b.restart != nil }

// Failed: the trainers will get no resume: the start's restore failed or
// was cancelled.
func (b *Boot) Failed() bool { return b.gone != "" }

// Aborted: the start was given up during the restore (Exit says how the
// agent exits).
func (b *Boot) Aborted() bool { return b.aborted != nil }

// StartBeside starts the start's restore beside the loop, while the
// trainer starts; its end comes on Done.
func (b *Boot) StartBeside() {
	b.env.Log.Info("restoring while the trainer starts")
	b.restoring = b.beside()
}

// beside runs Env.Fetch beside the loop.
func (b *Boot) beside() *Pending { return Beside(b.env.Life, b.env.GoBgFail, b.env.Fetch) }

// TrainerExited: the trainer exited while the start's restore runs:
// nobody is left to resume, the restore is cancelled (once) and its end
// awaited.
func (b *Boot) TrainerExited() {
	if p := b.restoring; p != nil && p.why == "" {
		p.Cancel("the trainer exited")
	}
}

// StopTrainerAt: the trainer, told that the restore failed, should exit
// with the error itself; at t it is stopped (AbandonDue).
func (b *Boot) StopTrainerAt(t time.Time) { b.abandonAt = t }

// AbandonAt is when a trainer told of a failed restore is stopped (zero:
// none is to be).
func (b *Boot) AbandonAt() time.Time { return b.abandonAt }

// AbandonDue: the trainer told of a failed restore is to be stopped now
// (once).
func (b *Boot) AbandonDue(now time.Time) bool {
	if b.abandonAt.IsZero() || now.Before(b.abandonAt) {
		return false
	}
	b.abandonAt = time.Time{}
	return true
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

// Pending is the restore running beside the loop; the loop owns it.
type Pending struct {
	cancel  context.CancelFunc
	done    chan Result
	held    []protocol.Event          // protocol 1 hellos waiting for it
	waiting map[uint64]*protocol.Conn // protocol 2 trainers told "pending"
	why     string                    // cancelled: why (a signal, a notice, no trainer left)
}

// Result is a restore's end.
type Result struct {
	Fetched *localdirs.Fetched
	Err     error
}

// Abort is why the start was given up while the restore ran.
type Abort struct {
	Sig    os.Signal // a signal: exit 128+N, as a cancelled start
	Notice bool      // a termination notice: exit 75, run me again
	Err    error     // the restore failed: exit 1 with it
}

// Beside runs fetch in a goroutine of the agent (goBgFail) and
// returns it as a Pending: its end comes on done.
func Beside(life context.Context, goBgFail func(func(), func(error)), fetch func(context.Context) (*localdirs.Fetched, error)) *Pending {
	ctx, cancel := context.WithCancel(life)
	p := &Pending{cancel: cancel, done: make(chan Result, 1), waiting: map[uint64]*protocol.Conn{}}
	goBgFail(func() {
		defer cancel()
		f, err := fetch(ctx)
		p.done <- Result{Fetched: f, Err: err}
	}, func(err error) { p.done <- Result{Err: fmt.Errorf("restore: %w", err)} })
	return p
}

// Ended: the overlapped restore ended (res). A cancelled one tells the
// trainers waiting (ok false); so does a failed one, which gives the
// start up (Aborted) and returns its err, after errs (its metric). ok:
// the restore is in place and recorded (Env.Record); p's trainers wait
// for Restored.
func (b *Boot) Ended(res Result, log *zap.Logger, errs func()) (p *Pending, err error, ok bool) {
	p = b.restoring
	b.restoring = nil
	switch {
	case p.why != "":
		if res.Fetched != nil {
			log.Info("restore finished after the start was given up: not used", zap.String("why", p.why))
		}
		b.gone = "restore cancelled: " + p.why
		p.tellFailed(b.gone)
		return p, nil, false
	case res.Err != nil:
		err := res.Err // "restore: ..." (localdirs.FetchRestore)
		log.Error("restore failed: the trainer is told and stopped; the agent exits 1", zap.Error(err))
		errs()
		b.aborted = &Abort{Err: err}
		b.gone = err.Error()
		p.tellFailed(err.Error())
		return p, err, false
	}
	b.resume = b.env.Record(res.Fetched)
	return p, nil, true
}

// Restored tells the trainers waiting for p the resume r: each told
// "pending" gets it handed (hand) and restored {resume}; each held
// protocol 1 hello is admitted (admit).
func (p *Pending) Restored(r *protocol.Resume, log *zap.Logger, hand func(*protocol.Resume, *protocol.Conn), admit func(protocol.Event)) {
	for _, c := range p.waiting {
		hand(r, c) // dirs.go
		if err := c.Post(protocol.Message{Type: protocol.TypeRestored, Resume: r}); err != nil {
			log.Warn("restored not delivered", zap.Uint64("conn", c.ID()), zap.Error(err))
		}
	}
	for _, ev := range p.held {
		admit(ev)
	}
}

// Abort gives the start up while the restore runs: the restore is
// cancelled (its partial directory goes) and ab kept unless the start
// was given up already. True when there was a restore to abort.
func (b *Boot) Abort(why string, ab *Abort) bool {
	p := b.restoring
	if p == nil {
		return false
	}
	if b.aborted == nil {
		b.aborted = ab
	}
	p.Cancel(why)
	return true
}

// Cancel cancels the restore, for why.
func (p *Pending) Cancel(why string) {
	p.why = why
	p.cancel()
}

// Done is the loop's source of the restore's end (nil: none running).
func (b *Boot) Done() <-chan Result {
	if b.restoring == nil {
		return nil
	}
	return b.restoring.done
}

// Exit is Run's answer after a start given up during the restore
// (ok false: none was).
func (b *Boot) Exit() (code int, err error, ok bool) {
	ab := b.aborted
	switch {
	case ab == nil:
		return 0, nil, false
	case ab.Sig != nil:
		code, err = sigrelay.StartCancelled(ab.Sig)
		return code, err, true
	case ab.Notice:
		return protocol.ExitInterrupted, nil, true
	}
	return 1, ab.Err, true
}

// Forget drops a connection that closed from the restores' waiters.
func (b *Boot) Forget(id uint64) {
	b.rejoin.forget(id)
	b.restoring.forget(id)
	b.restart.forget(id)
}

// forget drops a connection that closed from p's waiters (p may be nil).
func (p *Pending) forget(id uint64) {
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
func (p *Pending) tellFailed(why string) {
	for _, c := range p.waiting {
		c.Post(protocol.Message{Type: protocol.TypeRestoreFailed, Error: why})
	}
	for _, ev := range p.held {
		ev.Conn.SendNoWait(protocol.Message{Type: protocol.TypeError, Error: "run could not start: " + why}, true)
	}
}

// Hello answers a hello while the restore runs or after it
// failed; false: the restore is over and ok, the hello is served as usual.
// welcomeFor is the agent's welcome (Config.Welcome).
func (b *Boot) Hello(ev protocol.Event, log *zap.Logger, welcomeFor func(protocol.Message, *protocol.Resume) protocol.Message) (welcome *protocol.Message, handled bool) {
	c, m := ev.Conn, ev.Msg
	failed := b.gone
	p := b.restoring
	if p == nil {
		p = b.rejoin // rejoin.go: a trainer back after a commit
	}
	if p == nil {
		p = b.restart // restart.go: a hello while a restart's restore runs
	}
	if failed == "" && p == nil {
		return nil, false
	}
	if m.Version < 2 {
		if failed != "" {
			c.SendNoWait(protocol.Message{Type: protocol.TypeError, Error: "run could not start: " + failed}, true)
			return nil, true
		}
		log.Info("trainer connected (protocol 1): its welcome waits for the restore", zap.Uint64("conn", c.ID()), zap.Int("pid", m.PID))
		p.held = append(p.held, ev)
		return nil, true
	}
	w := welcomeFor(m, b.resume)
	if failed != "" {
		w.Restore, w.Error = protocol.RestoreFailed, failed
	} else {
		w.Restore, w.Resume = protocol.RestorePending, nil // a trainer back after a commit: not the older one
		p.waiting[c.ID()] = c
	}
	return &w, true
}

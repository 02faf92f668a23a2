// Package bootrestore is the agent's restore beside the trainers (Boot):
// the start-up restore that runs while the trainer starts (the overlapped
// restore, Config.OverlapRestore), the hellos meanwhile (held and pending
// welcomes), restored and restore_failed, a start given up meanwhile; and
// the restore for a trainer back after a commit (rejoin.go). The agent
// (pkg/supervisor's agent_restore.go) owns one Boot and drives it from its
// loop; what it needs of the agent comes in as values and functions.
package bootrestore

import (
	"context"
	"fmt"
	"os"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/supervisor/localdirs"
	"github.com/spotagent/spotagent/pkg/supervisor/ranks"
	"github.com/spotagent/spotagent/pkg/supervisor/sigrelay"
)

// Boot is the restore at the start: the resume the trainers are
// told of, and the restore running beside the trainer's start (Restoring);
// Aborted: the start was given up meanwhile; Gone: why the trainers will
// get no resume (it failed or was cancelled); AbandonAt: when a trainer
// told of a failed restore is stopped.
type Boot struct {
	Resume    *protocol.Resume
	Restoring *Pending
	// rejoin.go: the restore for a trainer back after a commit (its
	// done nil while it waits for the uploads in flight), the commit it
	// last restored for, the trainers connected at its hello, its needs
	Rejoin          *Pending
	rejoinFor       string
	rejoinConnected int
	Env             Env
	Aborted         *Abort
	Gone            string
	AbandonAt       time.Time
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
	Why     string                    // cancelled: why (a signal, a notice, no trainer left)
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
// the restore is in place; p's trainers wait for Restored.
func (b *Boot) Ended(res Result, log *zap.Logger, errs func()) (p *Pending, err error, ok bool) {
	p = b.Restoring
	b.Restoring = nil
	switch {
	case p.Why != "":
		if res.Fetched != nil {
			log.Info("restore finished after the start was given up: not used", zap.String("why", p.Why))
		}
		b.Gone = "restore cancelled: " + p.Why
		p.tellFailed(b.Gone)
		return p, nil, false
	case res.Err != nil:
		err := res.Err // "restore: ..." (localdirs.FetchRestore)
		log.Error("restore failed: the trainer is told and stopped; the agent exits 1", zap.Error(err))
		errs()
		b.Aborted = &Abort{Err: err}
		b.Gone = err.Error()
		p.tellFailed(err.Error())
		return p, err, false
	}
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
	p := b.Restoring
	if p == nil {
		return false
	}
	if b.Aborted == nil {
		b.Aborted = ab
	}
	p.Cancel(why)
	return true
}

// Cancel cancels the restore, for why.
func (p *Pending) Cancel(why string) {
	p.Why = why
	p.cancel()
}

// Done is the loop's source of the restore's end (nil: none running).
func (b *Boot) Done() <-chan Result {
	if b.Restoring == nil {
		return nil
	}
	return b.Restoring.done
}

// Exit is Run's answer after a start given up during the restore
// (ok false: none was).
func (b *Boot) Exit() (code int, err error, ok bool) {
	ab := b.Aborted
	switch {
	case ab == nil:
		return 0, nil, false
	case ab.Sig != nil:
		code, err = sigrelay.StartCancelled(ab.Sig)
		return code, err, true
	case ab.Notice:
		return ranks.ExitInterrupted, nil, true
	}
	return 1, ab.Err, true
}

// Forget drops a connection that closed from the restores' waiters.
func (b *Boot) Forget(id uint64) {
	b.Rejoin.forget(id)
	b.Restoring.forget(id)
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
	failed := b.Gone
	p := b.Restoring
	if p == nil {
		p = b.Rejoin // rejoin.go: a trainer back after a commit
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
	w := welcomeFor(m, b.Resume)
	if failed != "" {
		w.Restore, w.Error = protocol.RestoreFailed, failed
	} else {
		w.Restore, w.Resume = protocol.RestorePending, nil // a trainer back after a commit: not the older one
		p.waiting[c.ID()] = c
	}
	return &w, true
}

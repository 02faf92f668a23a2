// Package bootrestore is the agent's one owner of every restore (Boot):
// the start's (before the trainer starts, or while it starts: the
// overlapped restore, Config.OverlapRestore), a restart's and
// the one for a trainer back after a commit. Every restore but
// the serial start's runs beside the loop, so that a signal or a notice
// meanwhile is handled at once; each fetches with the one Env.Fetch and is
// recorded by the one Env.Record. The hellos meanwhile (held and pending
// welcomes), restored and restore_failed, and a start given up meanwhile
// are here too. The agent (pkg/supervisor's restore.go) owns one
// Boot and drives it from its loop; what it needs of the agent comes in as
// values and functions.
package bootrestore

// Every restore, in the order a run meets them: the start's (Boot: serial
// before the trainer, or beside its start with the hellos held), a
// restart's (beside the loop, cancelled by a stop), and a trainer's back
// after a commit (its hello waits for a restore of the newest committed
// checkpoint, one decision per restarted group).

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/localdirs"
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
	restart   *Pending // a restart's restore
	// the restore for a trainer back after a commit (its
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
// during the start cancels (pkg/supervisor, startSignals).
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

// NoResumeWhy says why connected trainers have nothing worth saving yet,
// as a stop's log line and journal record say it, or "": a restore runs
// that they wait on (the start's, or a trainer's back after a commit; a
// restart's trainer is not running while its restore does), or the
// restore failed (agent simulation, seed 143: three trainers were
// connected, waiting, and the stop said "no trainer connected").
func (b *Boot) NoResumeWhy() string {
	switch {
	case b.restoring != nil || b.rejoin != nil:
		return "a restore runs: no trainer has resumed"
	case b.Failed():
		return "the restore failed: no trainer resumed"
	}
	return ""
}

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
		code, err = StartCancelled(ab.Sig)
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
		p = b.rejoin // a trainer back after a commit
	}
	if p == nil {
		p = b.restart // a hello while a restart's restore runs
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

// A restart's restore: a trainer that failed on its own is started again
// from the newest committed checkpoint (childproc.Process's restart). The
// restore runs beside the loop, as every restore but the serial start's
// does, so that the agent keeps answering meanwhile: a signal or a
// termination notice cancels it (CancelRestart: its partial directory
// goes, restore.Into removes it), the trainer is not started again, and
// the stop goes on as when no trainer runs. A hello meanwhile waits for
// it as for the start's overlapped restore (Hello).

// StartRestart starts a restart's restore beside the loop; its end comes
// on RestartDone. The caller checks that no restore is Busy.
func (b *Boot) StartRestart() {
	b.env.Log.Info("trainer restarts: restoring the newest committed checkpoint first")
	b.restart = b.beside()
}

// Restarting: a restart's restore runs.
func (b *Boot) Restarting() bool { return b.restart != nil }

// RestartDone is the loop's source of the restart's restore's end (nil:
// none running).
func (b *Boot) RestartDone() <-chan Result {
	if b.restart == nil {
		return nil
	}
	return b.restart.done
}

// CancelRestart cancels the restart's restore, for why; true when one was
// running. Its end still comes on RestartDone, and is not used.
func (b *Boot) CancelRestart(why string) bool {
	p := b.restart
	if p == nil || p.why != "" {
		return false
	}
	b.env.Log.Warn("stop during a restart's restore: cancelling it; the trainer is not started again", zap.String("why", why))
	p.Cancel(why)
	return true
}

// OnRestarted: the restart's restore ended (res); the hellos that came
// meanwhile learn how. start: the restore is in place and recorded
// (Env.Record): the trainer starts again. A failed one returns its err,
// after its metric; a cancelled one neither (the stop that cancelled it
// gave the trainer up).
func (b *Boot) OnRestarted(res Result) (start bool, err error) {
	p := b.restart
	b.restart = nil
	switch {
	case p.why != "":
		if res.Fetched != nil {
			b.env.Log.Info("restore for restart finished after it was cancelled: not used", zap.String("why", p.why))
		}
		p.tellFailed("restore cancelled: " + p.why)
		return false, nil
	case res.Err != nil:
		b.env.Log.Error("restore for restart failed", zap.Error(res.Err))
		b.env.Errs()
		p.tellFailed(res.Err.Error())
		return false, res.Err
	}
	b.resume = b.env.Record(res.Fetched)
	p.Restored(b.resume, b.env.Log, b.env.Hand, func(ev protocol.Event) { b.env.Admit(ev, b.resume) })
	return true, nil
}

// A trainer back after a commit (docs/protocol.md, "A trainer back after
// a commit"): a trainer that says hello to a live agent (sidecar mode's
// container restarted in place, a node-mode rank's process restarted by
// torchrun, a crashed rank reconnecting) is welcomed with the newest
// committed checkpoint, never with the older one the agent's start
// restored. When this session committed a newer step than the resume it
// would hand out (or an upload is in flight: the hello waits for it first,
// as a restart does), the hello starts a restore of what the store's rules
// choose now (restore.Into: the local tier first, so it is fast; the
// store otherwise; in a multi-node job the newest JOB checkpoint, which is
// this node's newest commit once the job manifest landed), beside the
// loop, into the agent's restore area (a fresh directory named for the
// checkpoint; FetchRestore deletes every older restore and every handed
// one). It is served as the start's overlapped restore is
// (boot.go): a protocol 2 hello is welcomed at once with restore
// "pending", then restored {resume} or restore_failed {error}; a protocol
// 1 hello's welcome waits for it. Every hello that comes while it runs
// gets its result. No checkpoint is asked for meanwhile (trainers() is
// 0): the group has not resumed. A failed restore tells the waiting
// trainers restore_failed (the agent runs on: the next hello tries
// again); the older checkpoint is never handed out instead.
//
// One decision per restarted group: the ranks that come back one after
// the other must resume the same checkpoint. The result stands for later
// hellos until this session commits again (a commit needs the whole
// group: it has resumed) or until no trainer is connected (a new
// restart); only then may a hello restore again.

// Env is what the restores need of the agent (set once, in newAgent):
// every restore fetches with Fetch (the source's, with the options built
// once; beside the loop, it touches none of the loop's state) and is
// recorded by Record (on the loop). NoRejoin: a trainer back after a
// commit resumes what it finds (zero-code mode: its own directory).
type Env struct {
	Life     context.Context
	GoBgFail func(func(), func(error))
	Fetch    func(context.Context) (*localdirs.Fetched, error) // nil, nil: no committed checkpoint
	Record   func(*localdirs.Fetched) *protocol.Resume         // the agent's one record of a restore (nil: a fresh start)
	Hand     func(*protocol.Resume, *protocol.Conn)            // localDirs.handRestore
	Admit    func(protocol.Event, *protocol.Resume)            // a held protocol 1 hello: its welcome
	Errs     func()                                            // the restore error's metric
	NoRejoin bool
	Log      *zap.Logger
}

// Committed is this session's newest committed checkpoint (id empty:
// none), as the agent's commits hold it.
type Committed struct {
	ID   string
	Step int64
}

// RejoinHello: a hello comes (before the start's restore answers it);
// when a commit newer than the resume may be due for it, the hello waits
// for the rejoin restore, which starts once no upload is in flight
// (RejoinTick): a trainer that crashed right after done must resume that
// checkpoint once it committed. connected: trainers connected now.
func (b *Boot) RejoinHello(last Committed, connected, uploads int) {
	if b.Busy() || b.gone != "" || b.env.NoRejoin {
		return
	}
	if uploads == 0 && !b.rejoinStale(last, connected) {
		return
	}
	b.rejoin = &Pending{waiting: map[uint64]*protocol.Conn{}} // started by RejoinTick
	b.rejoinConnected = connected
}

// rejoinStale reports whether the resume the agent would hand out is older
// than this session's newest commit, and that was not already decided for
// this group (one decision until the next commit, or no trainer connected).
func (b *Boot) rejoinStale(last Committed, connected int) bool {
	if last.ID == "" || (b.resume != nil && last.Step <= b.resume.Step) {
		return false
	}
	return last.ID != b.rejoinFor || connected == 0
}

// RejoinTick starts the rejoin restore that waits, once no upload is in
// flight; nothing newer committed after all (the upload failed): the
// hellos get the resume as it is.
func (b *Boot) RejoinTick(last Committed, uploads int) {
	p := b.rejoin
	if p == nil || p.done != nil || uploads > 0 {
		return
	}
	if !b.rejoinStale(last, b.rejoinConnected) {
		b.OnRejoined(Result{})
		return
	}
	from := int64(-1)
	if b.resume != nil {
		from = b.resume.Step
	}
	b.env.Log.Info("a trainer is back after a commit: restoring the newest committed checkpoint before it resumes",
		zap.Int64("resume_step", from), zap.Int64("committed_step", last.Step), zap.String("committed_id", last.ID))
	b.rejoinFor = last.ID
	q := b.beside()
	p.cancel, p.done = q.cancel, q.done
}

// RejoinDone is the loop's source of the rejoin restore's end (nil: none
// running).
func (b *Boot) RejoinDone() <-chan Result {
	if b.rejoin == nil {
		return nil
	}
	return b.rejoin.done
}

// OnRejoined: the rejoin restore ended; the trainers waiting learn how.
func (b *Boot) OnRejoined(res Result) {
	p, env := b.rejoin, b.env
	b.rejoin = nil
	if res.Err != nil {
		env.Log.Error("restore for a trainer back after a commit failed: it is told (the older checkpoint is not handed out)", zap.Error(res.Err))
		env.Errs()
		b.rejoinFor = "" // the next hello tries again
		p.tellFailed(res.Err.Error())
		return
	}
	if res.Fetched != nil {
		b.resume = env.Record(res.Fetched)
	}
	p.Restored(b.resume, env.Log, env.Hand, func(ev protocol.Event) { env.Admit(ev, b.resume) })
}

// StartCancelled is the agent's answer to a signal during start-up: the exit
// code a shell gives for that signal (143 for SIGTERM, 130 for SIGINT).
func StartCancelled(s os.Signal) (int, error) {
	code := 1
	if sig, ok := s.(syscall.Signal); ok {
		code = 128 + int(sig)
	}
	return code, fmt.Errorf("start-up cancelled by %s", s)
}

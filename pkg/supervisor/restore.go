package supervisor

// The start, top to bottom: the signals before the loop reads them (a
// SIGTERM/SIGINT cancels the start-up: startSignals); the checkpoint
// source the loop drives and how its restores are fetched (newSource,
// sourceRestore; the agent as a source's Host), the agent's side of its one owner of restores (set up
// once by openRestores; the overlapped start's end, onRestoreDone; a start
// given up, abortStart; a restart's end, restarted), and the welcome a
// trainer's hello gets (onHello, admit) naming the restored checkpoint.

import (
	"context"
	"os"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/checkpoint/restore"
	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/bootrestore"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/localdirs"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/trainers"
	"github.com/spotagent/spotagent/pkg/supervisor/source"
)

// startSignals lets SIGTERM/SIGINT cancel the agent's start (the lease,
// the journal read, the restore, which a slow or silent store can hold
// up for long) before the loop reads signals itself. ctx is cancelled by
// the first signal that arrives while starting; started ends the start:
// it returns the signal that cancelled it (nil: none), and from then on
// every signal goes to the returned channel, for the loop. stop ends the
// relay (the agent's Run returns).
func startSignals(parent context.Context, signals <-chan os.Signal, log *zap.Logger) (ctx context.Context, loop <-chan os.Signal, started func() os.Signal, stop func()) {
	if log == nil {
		log = zap.NewNop()
	}
	ctx, cancel := context.WithCancel(parent)
	out := make(chan os.Signal, 4)
	done, ended := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	starting := true
	var got os.Signal
	go func() {
		defer close(ended)
		for {
			var s os.Signal
			select {
			case <-done:
				return
			case s = <-signals:
			}
			mu.Lock()
			if starting {
				if got == nil {
					got = s
					log.Warn("signal during start-up: cancelling it (the trainer is not started)", zap.String("signal", s.String()))
					cancel()
				}
				mu.Unlock()
				continue
			}
			mu.Unlock()
			select {
			case out <- s:
			case <-done:
				return
			}
		}
	}()
	return ctx, out, func() os.Signal {
			mu.Lock()
			defer mu.Unlock()
			starting = false
			return got
		}, func() {
			close(done)
			<-ended
		}
}

var (
	_ source.Source = protocolSource{}
	_ source.Host   = agentHost{}
	_ source.Stop   = (*stopState)(nil)
)

// sourceRestore is how a source's restores are made, for the agent's one
// owner of restores (pkg/supervisor/internal/bootrestore): fetch puts the newest
// committed checkpoint where the trainer resumes from (beside the loop:
// it touches none of the loop's state; nil, nil: none committed), and
// restored, when not nil, tells the source of each (on the loop; f nil: a
// fresh start; restart: a restart's restore).
type sourceRestore struct {
	fetch    func(ctx context.Context, opts restore.Options) (*localdirs.Fetched, error)
	restored func(f *localdirs.Fetched, restart bool)
}

// newSource is the checkpoint source Config asks for, and how its
// restores are made: the one place that knows the kinds.
func (a *Agent) newSource() (source.Source, sourceRestore, error) {
	h := agentHost{a}
	if a.cfg.Watch == nil {
		return protocolSource{host: h}, sourceRestore{fetch: func(ctx context.Context, opts restore.Options) (*localdirs.Fetched, error) {
			return a.dirs.FetchRestore(ctx, a.cfg.Store, opts, a.log) // into the agent's restore area
		}}, nil
	}
	ws, err := source.NewWatch(h, source.Env{Watch: a.cfg.Watch, HasCommand: len(a.cfg.Command) > 0, Signal: a.cfg.Signal,
		CheckpointDir: a.cfg.CheckpointDir, Store: a.cfg.Store, Keep: a.cfg.Keep, Metrics: a.cfg.Metrics, Log: a.log, Started: a.sess.Started(),
		Life: a.life, GoBg: a.goBg})
	if err != nil {
		return nil, sourceRestore{}, err
	}
	// Commits check before each manifest that the checkpoint did not
	// change during its upload.
	a.commits.useCommitter(a.commits.committer.OnStore(ws.Store()))
	return ws, sourceRestore{fetch: func(ctx context.Context, opts restore.Options) (*localdirs.Fetched, error) {
		return ws.Fetch(ctx, opts, a.dirs.Area, a.dirs.AreaPath) // the area is opened after the source is made
	}, restored: ws.Restored}, nil
}

// protocolSource: the trainer speaks the protocol (the default). Its
// restores go into the agent's restore area (newSource).
type protocolSource struct {
	host source.Host
}

func (protocolSource) Start()                                      {}
func (protocolSource) Close()                                      {}
func (protocolSource) Ready() <-chan func()                        { return nil }
func (protocolSource) Tick(time.Time)                              {}
func (protocolSource) Committed(source.Result)                     {}
func (protocolSource) Stop(source.Stop, time.Time, time.Time) bool { return false }
func (protocolSource) Asks() bool                                  { return true }

// View: nothing of its own to wake for or wait on; the trainer reached
// what it reported (progress, done, bye).
func (p protocolSource) View(time.Time) source.View {
	return source.View{Reached: p.host.State().TrainerStep}
}

// agentHost is the agent as its checkpoint source's host.
type agentHost struct{ a *Agent }

func (h agentHost) State() source.State {
	a, l, p := h.a, h.a.commits.last, h.a.proc
	return source.State{
		Last:        source.Committed{ID: l.id, Step: l.step, Bytes: l.bytes, TrainedAt: l.trainedAt},
		TrainerStep: a.commits.lastStep,
		// A restart's restore running is a restart pending.
		Trainer: source.Trainer{Running: p.Running(), Gone: len(a.cfg.Command) > 0 && !p.Running(),
			ExitCode: p.ExitCode(), RestartPending: !p.RestartAt().IsZero() || a.boot.Restarting()},
		Stopping: a.stops.current != nil,
	}
}

func (h agentHost) SeeStep(step *int64) { h.a.commits.seeStep(step) }
func (h agentHost) StopTrainer()        { h.a.proc.StopAtDeadline(h.a.life, h.a.goBg) }

// Commit: a source's checkpoint is answered, as by one trainer, when it
// is handed over; its request is due within RequestTimeout.
func (h agentHost) Commit(u source.Upload, now time.Time) {
	r := &request{id: u.ID, reason: u.Reason, dir: u.Dir, rel: u.Rel, parent: u.Parent, held: u.Held, sent: now, deadline: now.Add(h.a.cfg.RequestTimeout),
		waiting: map[uint64]bool{}, answered: 1, step: u.Step, metadata: u.Metadata, costFrom: u.CostFrom}
	h.a.commits.unblocked(now)
	h.a.commit(r)
}

func (h agentHost) CancelUpload(id string) bool {
	up := h.a.commits.uploads[id]
	if up != nil {
		up.cancel()
	}
	return up != nil
}

func (h agentHost) SignalTrainer(sig syscall.Signal) error {
	return h.a.proc.Signal(sig)
}

func (h agentHost) StopCommitted(s source.Stop, res *commit.Result, now time.Time) {
	h.a.stops.committed(s.(*stopState), res, now, h.a.stopEnds())
}

func (h agentHost) StopFailed(s source.Stop, why string, now time.Time) {
	h.a.stops.failed(s.(*stopState), why, now, h.a.stopEnds())
}

// The restore beside the trainers (pkg/supervisor/internal/bootrestore: the
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
// asks for it (pkg/supervisor/internal/bootrestore): this session's newest commit,
// or in part mode a newer job checkpoint whose commit failed here after
// its part may have been written (partFailed): a trainer back then has the
// store looked at, which holds the job checkpoint if another node's agent
// committed it (agent simulation seed 792: handed an older resume).
func (c *commits) committed() bootrestore.Committed {
	if c.unsure.ID != "" && c.unsure.Step > c.last.step {
		return c.unsure
	}
	return bootrestore.Committed{ID: c.last.id, Step: c.last.step}
}

func (a *Agent) onHello(c *protocol.Conn, m protocol.Message) {
	a.boot.RejoinHello(a.commits.committed(), a.conns.Count(), len(a.commits.uploads)) // pkg/supervisor/internal/bootrestore
	a.boot.RejoinTick(a.commits.committed(), len(a.commits.uploads))
	if w, handled := a.boot.Hello(protocol.Event{Conn: c, Msg: m}, a.cfg.Log, a.cfg.Welcome); handled {
		if w != nil {
			a.admit(c, m, *w)
		}
		return
	}
	a.admit(c, m, a.cfg.Welcome(m, a.boot.Resume()))
}

// admit sends the welcome w answering hello m and counts c as a trainer.
func (a *Agent) admit(c *protocol.Conn, m protocol.Message, w protocol.Message) {
	a.dirs.handRestore(a.log, w.Resume, c) // dirs.go: a trainer of another uid can read it
	if err := c.Post(w); err != nil {
		a.log.Warn("welcome not delivered", zap.Uint64("conn", c.ID()), zap.Error(err))
		return
	}
	fields := []zap.Field{zap.Uint64("conn", c.ID()), zap.Int("pid", m.PID), zap.Int("peer_uid", c.PeerUID())}
	if m.Rank != nil {
		fields = append(fields, zap.Int("rank", *m.Rank))
	}
	// One line: connected, or connected but left out (pkg/supervisor/internal/trainers:
	// the child's own connections go first).
	if why := a.conns.Welcomed(c); why != "" {
		a.log.Warn(trainers.LeftOutMsg, append(fields, zap.String("why", why))...)
	} else {
		a.log.Info("trainer connected", fields...)
	}
	a.job.hello(m, a.log)                                                    // job.go
	a.ranks.Hello(m, a.proc.Running())                                       // pkg/supervisor/internal/ranks
	a.live.Start(m, heartbeatEnv(&a.cfg), a.job.part(), a.sess.ID(), a.life) // pkg/supervisor/internal/ranks
	// A trainer that connects during an interruption is told at once.
	a.stops.lateTrainer(c)
}

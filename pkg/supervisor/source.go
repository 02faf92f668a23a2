package supervisor

import (
	"context"
	"syscall"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/checkpoint/restore"
	"github.com/spotagent/spotagent/pkg/supervisor/localdirs"
	"github.com/spotagent/spotagent/pkg/supervisor/source"
)

var (
	_ source.Source = protocolSource{}
	_ source.Host   = agentHost{}
	_ source.Stop   = (*stopState)(nil)
)

// sourceRestore is how a source's restores are made, for the agent's one
// owner of restores (pkg/supervisor/bootrestore): fetch puts the newest
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

package supervisor

import (
	"context"
	"os"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/checkpoint/restore"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/supervisor/localdirs"
	"github.com/spotagent/spotagent/pkg/supervisor/source"
)

var (
	_ source.Source = protocolSource{}
	_ source.Host   = agentHost{}
	_ source.Stop   = (*stopState)(nil)
)

// newSource is the checkpoint source Config asks for: the one place that
// knows the kinds.
func (a *Agent) newSource() (source.Source, error) {
	h := agentHost{a}
	if a.cfg.Watch == nil {
		return protocolSource{host: h, dirs: &a.dirs, store: a.cfg.Store, part: a.job.restorePart(), log: a.log}, nil
	}
	ws, err := source.NewWatch(h, source.Env{Watch: a.cfg.Watch, HasCommand: len(a.cfg.Command) > 0, Signal: a.cfg.Signal,
		CheckpointDir: a.cfg.CheckpointDir, Store: a.cfg.Store, Keep: a.cfg.Keep, Metrics: a.cfg.Metrics, Log: a.log, Started: a.sess.Started()})
	if err != nil {
		return nil, err
	}
	// Commits check before each manifest that the checkpoint did not
	// change during its upload.
	c := *a.commits.committer
	c.Store = ws.Store()
	a.commits.useCommitter(&c)
	return ws, nil
}

// protocolSource: the trainer speaks the protocol (the default).
type protocolSource struct {
	host  source.Host
	dirs  *localDirs // the restore area
	store cloud.Store
	part  string // the part a restore fetches (jobPolicy.restorePart)
	log   *zap.Logger
}

// Restore copies the newest committed checkpoint into the restore area
// and returns the resume information (nil when starting fresh).
func (p protocolSource) Restore(ctx context.Context) (*protocol.Resume, error) {
	opts := restore.Options{Log: p.log, MaxEpoch: p.host.Epoch(), Part: p.part}
	f, err := p.dirs.FetchRestore(ctx, p.store, opts, p.log)
	if err != nil || f == nil {
		return nil, err
	}
	return p.host.Restored(f.R, f.Start, f.R.Dir, f.Manifest), nil
}

func (protocolSource) Start()                                      {}
func (protocolSource) Close()                                      {}
func (protocolSource) Ready() <-chan func()                        { return nil }
func (protocolSource) Tick(time.Time)                              {}
func (protocolSource) Wake() time.Time                             { return time.Time{} }
func (protocolSource) Busy(time.Time) bool                         { return false }
func (protocolSource) Committed(source.Result)                     {}
func (protocolSource) Stop(source.Stop, time.Time, time.Time) bool { return false }
func (protocolSource) Asks() bool                                  { return true }

// Reached: what the trainer reported (progress, done, bye).
func (p protocolSource) Reached(time.Time) (int64, string) { return p.host.TrainerStep(), "" }

// agentHost is the agent as its checkpoint source's host.
type agentHost struct{ a *Agent }

func (h agentHost) Life() context.Context { return h.a.life }
func (h agentHost) GoBg(fn func())        { h.a.goBg(fn) }
func (h agentHost) Last() source.Committed {
	l := h.a.commits.last
	return source.Committed{ID: l.id, Step: l.step, Bytes: l.bytes, TrainedAt: l.trainedAt}
}
func (h agentHost) TrainerStep() int64  { return h.a.commits.lastStep }
func (h agentHost) SeeStep(step *int64) { h.a.commits.seeStep(step) }
func (h agentHost) Epoch() int64        { return h.a.commits.epoch() }
func (h agentHost) Stopping() bool      { return h.a.stops.current != nil }
func (h agentHost) StopTrainer()        { h.a.proc.StopAtDeadline(h.a.life, h.a.goBg) }

func (h agentHost) NewID() string { return localdirs.NewRequestID() }

func (h agentHost) Area() (*os.Root, string) { return h.a.dirs.Area, h.a.dirs.AreaPath }

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

func (h agentHost) Restored(r *restore.Result, start time.Time, dir, manifest string) *protocol.Resume {
	return h.a.commits.restored(r, start, dir, manifest, h.a.sess, h.a.cfg.Metrics, h.a.cfg.Node)
}

func (h agentHost) Trainer() source.Trainer {
	p := h.a.proc
	return source.Trainer{Started: p.Started(), Running: p.Running(), Gone: len(h.a.cfg.Command) > 0 && !p.Running(),
		ExitCode: p.ExitCode(), RestartPending: !p.RestartAt().IsZero()}
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

package supervisor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/supervisor/session"
)

// Fencing: two agents on one run (an ASG with Capacity Rebalancing starts
// the replacement before the old instance ends). Each session takes a lease
// with the next epoch before it restores (checkpoint.AcquireLease); the
// newest epoch owns the run. An older session learns it is fenced when a
// commit cannot publish (checkpoint.ErrFenced) or from the lease check
// every Config.FenceInterval: it asks its trainer for a last checkpoint,
// uploads it without publishing it as latest, tells the trainer to stop,
// writes no more journal and exits with exitFenced.

// exitFenced is the exit code of an agent whose run a newer session took
// over (protocol.ExitFenced).
const exitFenced = protocol.ExitFenced

// reasonFenced is the reason of the last checkpoint request and the stop
// message of a fenced agent.
const reasonFenced = "fenced"

// cloudFence is the cloud of a fenced stop's record: no cloud's notice,
// the agent's own lease check.
const cloudFence metadata.Cloud = "fence"

// defaultFenceInterval is how often an agent lists leases/ (one List).
const defaultFenceInterval = 30 * time.Second

// onFenced starts the fenced stop: a last checkpoint (uploaded, never
// published), then stop, with --term-grace as the deadline.
func (a *Agent) onFenced() {
	if a.stops.current != nil && a.stops.current.reason == reasonFenced {
		return
	}
	now := time.Now()
	n := metadata.Notice{Cloud: cloudFence, Kind: metadata.KindTermination, Detected: now,
		ID: fmt.Sprintf("fenced-by-%d", a.commits.lease().FencedBy()), Action: reasonFenced}
	a.log.Error("fenced: a newer session owns the run; taking a last checkpoint, which will not become latest, then stopping",
		zap.Int64("epoch", a.commits.epoch()), zap.Int64("newer_epoch", a.commits.lease().FencedBy()), zap.Duration("grace", a.cfg.TermGrace))
	a.cfg.Metrics.Error("fenced")
	n.Deadline = now.Add(a.cfg.TermGrace)
	if a.job.fencedStopsAtOnce() && a.stops.current == nil {
		// No last checkpoint: no part of this copy can be written any
		// more. Its trainers stop; the newer copy carries the node on.
		s := &stopState{notice: n, reason: reasonFenced, deadline: n.Deadline}
		a.stops.begin(s)
		a.stops.failed(s, "fenced: a newer copy of "+a.cfg.Node+" owns its part of the job", now, a.stopEnds())
		return
	}
	a.beginStop(n, reasonFenced, now)
}

// onFencedCommit handles a commit that uploaded (its manifest is in the
// store, under this session's epoch) but could not publish because a newer
// session fenced this one. It reports false for any other result.
func (a *Agent) onFencedCommit(r *request, err error) bool {
	if !errors.Is(err, checkpoint.ErrFenced) {
		return false
	}
	a.log.Warn("checkpoint uploaded but not published: a newer session owns the run",
		zap.String("id", r.id), zap.Int64("step", r.step), zap.String("reason", r.reason), zap.Error(err))
	a.conns.Broadcast(protocol.Message{Type: protocol.TypeUploadFailed, ID: r.id, Error: err.Error()})
	switch {
	case a.stops.current == nil:
		a.onFenced()
	case r.stop != nil && !r.stop.finished:
		a.stops.finish(r.stop, a.stopEnds())
	}
	return true
}

// takeLease takes this session's lease, before the restore: the restore
// then starts from what latest.json held when the lease sealed it. In
// part mode it takes the node's lease: a second live copy of node K (a
// spot replacement while the old machine still runs, a Job's pod
// replacement) fences the older copy, whose parts are then never written.
func takeLease(ctx context.Context, s *session.Session, cfg *Config, job jobPolicy, c *commit.Committer) error {
	if cfg.FenceInterval < 0 {
		return nil
	}
	rec := checkpoint.LeaseRecord{Session: s.ID(), Instance: session.MachineOf(cfg.Identity), Started: s.Started().UTC()}
	l, err := job.takeLease(ctx, cfg.Store, rec, c) // job_policy.go
	if err != nil {
		return err
	}
	s.Journal().FenceWith(l)
	if part := job.part(); part != "" {
		cfg.Log.Info("lease of this node taken", zap.String("part", part), zap.Int64("epoch", l.Epoch), zap.String("session", l.Session))
	} else {
		cfg.Log.Info("lease taken", zap.Int64("epoch", l.Epoch), zap.String("session", l.Session))
	}
	return nil
}

// pollLease checks the lease every FenceInterval, until the agent's life
// ends, and once fenced tells the loop (fences: its own event, not a
// notice).
func (c *commits) pollLease(ctx context.Context, every time.Duration, fences chan<- struct{}, goBg func(func()), log *zap.Logger) {
	l := c.lease()
	if l == nil {
		return
	}
	if every == 0 {
		every = defaultFenceInterval
	}
	goBg(func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			err := l.Check(ctx)
			if errors.Is(err, checkpoint.ErrFenced) {
				select {
				case fences <- struct{}{}:
				default: // the loop knows already
				}
				return
			}
			if err != nil && ctx.Err() == nil {
				log.Warn("lease check failed", zap.Error(err))
			}
		}
	})
}

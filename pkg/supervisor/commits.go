package supervisor

// What the loop knows of its requests, uploads and commits (commits),
// told what happened and asked; and the lease that fences them: taken for
// the session (takeLease), polled beside the loop (pollLease), the fenced
// stop (onFenced, onFencedCommit).

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/checkpoint/restore"
	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/bootrestore"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/localdirs"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/session"
	"github.com/spotagent/spotagent/pkg/supervisor/promise"
)

// commits is the checkpoints of this session: the requests the trainers
// were sent (request.go), the uploads under way, their results, the
// newest committed checkpoint, and the trainer's pace between them.
type commits struct {
	committer *commit.Committer
	pending   map[string]*request
	uploads   map[string]*upload
	results   chan commitResult
	last      committedCheckpoint
	unsure    bootrestore.Committed // part mode: the newest job checkpoint whose commit failed here after its part may have been written
	lastBlock time.Time             // when the trainer last finished saving (or started)
	blocked   float64               // seconds blocked in checkpoints this session (goodput)
	saveTook  time.Duration         // the newest request → done measured (request.go's silence: no deaf trainer warned of a slow save)
	lastStep  int64
	interval  time.Duration
	promise   promise.State // the notice checkpoint's prediction (pkg/supervisor/promise)
	// A request that could not be sent (notAsked) holds the next periodic
	// one off until askAt, waiting notAskedWait, doubled at each failure.
	askAt        time.Time
	notAskedWait time.Duration
}

// newCommits is a session's checkpoints before the first: the trainer's
// pace counts from started; committer commits them; p predicts a notice
// checkpoint. The loop tells it what happened (asked, dropped, uploading,
// uploadEnded, unblocked, saved, resumed, committedAs, intervalChanged).
func newCommits(started time.Time, committer *commit.Committer, p promise.State) commits {
	return commits{pending: map[string]*request{}, uploads: map[string]*upload{}, results: make(chan commitResult, 4),
		lastBlock: started, committer: committer, promise: p}
}

// useCommitter: the source commits through cm (zero-code mode's copy of
// the committer, whose store verifies each checkpoint before its manifest).
func (c *commits) useCommitter(cm *commit.Committer) { c.committer = cm }

// asked: r was sent to the trainers; it is pending until answered,
// failed, expired or abandoned (dropped).
func (c *commits) asked(r *request) {
	c.pending[r.id] = r
	c.askAt, c.notAskedWait = time.Time{}, 0
}

// notAsked: a request could not be sent at now (its directory could not be
// created or handed to the trainer's uid, or no trainer took it): the
// next periodic one waits 1 s, then twice as long after each failure in a
// row, up to a minute. A full disk or an area taken away made the loop ask
// again at every turn: 1,000 error lines a second at 87 % of a core.
func (c *commits) notAsked(now time.Time) {
	c.notAskedWait = min(max(2*c.notAskedWait, time.Second), time.Minute)
	c.askAt = now.Add(c.notAskedWait)
}

// askAfter is when the next periodic request may be sent: zero, or the
// end of notAsked's wait.
func (c *commits) askAfter() time.Time { return c.askAt }

// dropped: request id is pending no more.
func (c *commits) dropped(id string) { delete(c.pending, id) }

// uploading: u's upload (and commit) started beside the loop.
func (c *commits) uploading(u *upload) { c.uploads[u.req.id] = u }

// uploadEnded: the upload of request id ended (its result came); it is
// returned (nil: none was in flight).
func (c *commits) uploadEnded(id string) *upload {
	u := c.uploads[id]
	delete(c.uploads, id)
	return u
}

// unblocked: the trainer stopped being blocked by a checkpoint at now
// (its save ended, failed, or it took one of its own): the schedule
// counts the next interval from there.
func (c *commits) unblocked(now time.Time) { c.lastBlock = now }

// saved: the trainer answered a request at now, its save having taken
// took, of which cost blocked its training.
func (c *commits) saved(took, cost time.Duration, now time.Time) {
	c.saveTook = took
	c.lastBlock = now
	c.blocked += cost.Seconds()
}

// resumed: the trainer resumed the newest committed checkpoint at now:
// its state matches it from then, and the schedule counts from there.
func (c *commits) resumed(now time.Time) {
	c.lastBlock = now
	c.last.trainedAt = now
}

// committedAs: r committed as res; it is the newest committed checkpoint
// unless a newer step committed first (restore resumes from the newest).
func (c *commits) committedAs(r *request, res *commit.Result) {
	if res.Manifest.Step >= c.last.step {
		c.last = committedCheckpoint{id: r.id, step: res.Manifest.Step, at: res.Manifest.Created, bytes: res.Bytes, trainedAt: r.sent}
	}
}

// partFailed: in part mode r's commit failed here, its part perhaps
// written: another node's agent may still commit the job checkpoint with
// it (rank 0's assembles it), which this node would then not know of.
func (c *commits) partFailed(r *request) {
	if r.step > c.unsure.Step || c.unsure.ID == "" {
		c.unsure = bootrestore.Committed{ID: r.id, Step: r.step}
	}
}

// intervalChanged: the schedule's interval is iv now; true when that is
// a change.
func (c *commits) intervalChanged(iv time.Duration) bool {
	if iv == c.interval {
		return false
	}
	c.interval = iv
	return true
}

// lease is this session's lease: the run's, or in part mode the node's;
// nil when fencing is off.
func (c *commits) lease() *checkpoint.Lease {
	if c.committer.PartLease != nil {
		return c.committer.PartLease
	}
	return c.committer.Lease
}

// fenced reports whether a newer session took the run (or this node of
// the job) over.
func (c *commits) fenced() bool { return c.lease().Fenced() }

// epoch is this session's epoch of the run's lease (0: none, or part
// mode, where epochs count one node's sessions and manifests carry none).
func (c *commits) epoch() int64 {
	if l := c.committer.Lease; l != nil {
		return l.Epoch
	}
	return 0
}

// seeStep notes the newest step a trainer reported.
func (c *commits) seeStep(step *int64) {
	if step != nil && *step > c.lastStep {
		c.lastStep = *step
	}
}

// haltPipelines stops the early uploads of periodic checkpoints still being
// saved: an interruption checkpoint needs the bandwidth. Their files are
// uploaded at done, as without `saved`.
func (c *commits) haltPipelines() {
	for _, r := range c.pending {
		if r.pipe != nil && !r.urgent() {
			r.pipe.Halt()
		}
	}
}

// cancelPeriodic cancels the periodic uploads in flight, each once: an
// interruption checkpoint's upload began (its first early upload, or its
// commit), and its files go first. Their checkpoints are not committed.
func (c *commits) cancelPeriodic(log *zap.Logger) {
	for id, u := range c.uploads {
		if !u.req.urgent() && !u.cancelled {
			u.cancelled = true
			log.Info("cancelling periodic upload: interruption checkpoint takes priority", zap.String("id", id))
			u.cancel()
		}
	}
}

// restoreOptions are the options of every restore (built once, in
// newAgent, once the lease is taken: its epoch is the newest a restore
// may pick).
func (c *commits) restoreOptions(part string, log *zap.Logger) restore.Options {
	return restore.Options{Log: log, MaxEpoch: c.epoch(), Part: part}
}

// restored records a restore, every restore (the start's, a restart's, a
// trainer's back after a commit: pkg/supervisor/internal/bootrestore): metrics,
// journal, the newest committed checkpoint; it returns what the trainers
// are told. The restored checkpoint becomes the newest committed one, the
// trainer's state matching it from now, unless this session committed a
// newer step (a job whose manifest for it has not landed yet: the store's
// rules chose an older one).
func (c *commits) restored(f *localdirs.Fetched, s *session.Session, m Metrics, node string) *protocol.Resume {
	r := f.R
	m.Restored(r.Bytes, time.Since(f.Start))
	m.RestoredFrom(r.From)
	s.JournalAsync(func(j *journal.Journal) {
		j.Restores = append(j.Restores, journal.RestoreEntry{
			At: f.Start.UTC(), CheckpointID: r.Manifest.ID, Step: r.Manifest.Step, Manifest: r.Key,
			Bytes: r.Bytes, Seconds: r.Took.Seconds(), Skipped: r.Skipped, Node: node, From: r.From,
		})
	})
	resume := &protocol.Resume{Dir: f.Dir, Step: r.Manifest.Step, ID: r.Manifest.ID, Manifest: f.Manifest, Metadata: r.Manifest.Metadata}
	if c.last.id != "" && c.last.step > r.Manifest.Step {
		return resume
	}
	c.last = committedCheckpoint{id: r.Manifest.ID, step: r.Manifest.Step, at: r.Manifest.Created, bytes: r.Bytes}
	c.resumed(time.Now())
	return resume
}

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
	if a.job.fencedStopsAtOnce() {
		// No part of this copy can be written any more: its commits in
		// flight end now, whatever stop is under way (one waiting for
		// the other parts held the exit 76 up to the commit's bound,
		// 10 min; agentsim seeds 4, 180, 5832). A part written already
		// stands; the job manifest is rank 0's agent's to write (or the
		// others', once no part comes: commit's awaitParts).
		for id, u := range a.commits.uploads {
			a.log.Info("cancelling commit: fenced", zap.String("id", id))
			u.cancel()
		}
	}
	if a.job.fencedStopsAtOnce() && a.stops.current == nil {
		// No last checkpoint. Its trainers stop; the newer copy carries
		// the node on.
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
	l, err := job.takeLease(ctx, cfg.Store, rec, c) // job.go
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

package supervisor

// A checkpoint request, top to bottom: asked of the trainers (request),
// answered (onDone, onFailed, an unsolicited done), settled once every
// rank has answered (settle), committed beside the loop (commit) and its
// result taken (onCommitResult), or expired; whose files the checkpoint
// holds (a trainer of another user: noteAnswer, ownerUIDs); and, last,
// what the agent says when the trainers are silent (silence: no trainer
// connected when a checkpoint is due, a request unanswered past
// UnansweredAfter).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/localdirs"
)

// maxDoneMetadata bounds the metadata object a trainer stores with a checkpoint.
const maxDoneMetadata = 64 << 10

// request is a checkpoint the agent asked for (or a trainer announced).
type request struct {
	id, reason, dir string
	rel             string   // dir relative to parent, "/"-separated; never empty
	parent          *os.Root // what rel is relative to; nil: the checkpoint directory
	held            *os.Root // dir as opened for the commit, until it is removed
	sent, deadline  time.Time
	waiting         map[uint64]bool  // connections that still owe an answer
	answeredBy      map[uint64]bool  // connections that answered
	answerUIDs      map[uint64][]int // their foreign uids (the owner rule, below), kept after they close
	answered        int
	lost            int         // connections that went away owing an answer
	part            answerRanks // who answered, for a part (part mode, job.go)
	step            int64
	metadata        json.RawMessage
	stop            *stopState       // set for the interruption/shutdown checkpoint
	pipe            *commit.Pipeline // files uploaded on `saved`, before done
	blocked         *time.Duration   // the longest blocked_ms a trainer reported
	// costFrom, when set, is where the checkpoint's measured cost begins
	// (zero-code mode: its staging; the trainer's save is not seen): the
	// journal records what it took to the commit, not the scheduler's
	// estimate.
	costFrom time.Time
}

// answerRanks is the ranks that answered a request, and the job's world
// size as their hellos said: a node's part (part mode, job.go).
type answerRanks struct {
	ranks map[int]bool
	world int
}

func (r *request) urgent() bool { return r.stop != nil }

// upload is a commit in flight.
type upload struct {
	req       *request
	cancel    context.CancelFunc
	start     time.Time
	cancelled bool // by cancelPeriodic
}

type commitResult struct {
	req *request
	res *commit.Result
	err error
}

// request sends a checkpoint request to every trainer.
func (a *Agent) request(reason string, deadline time.Time, stop *stopState) *request {
	return a.requestID(localdirs.NewRequestID(), reason, deadline, stop)
}

// requestID sends the checkpoint request id (a fresh one, or one the job
// agreed on: job.go) to every trainer.
func (a *Agent) requestID(id, reason string, deadline time.Time, stop *stopState) *request {
	now := time.Now()
	dir := filepath.Join(a.dirs.AreaPath, id)
	if err := a.dirs.Area.Mkdir(id, 0o700); err != nil {
		a.log.Error("cannot create checkpoint directory", append([]zap.Field{zap.String("dir", dir), zap.Error(err)}, causeFields(err, "")...)...)
		a.cfg.Metrics.Error("checkpoint")
		a.commits.notAsked(now)
		return nil
	}
	if stop != nil {
		a.commits.haltPipelines() // agent_pipeline.go: the interruption's files go first
	}
	r := &request{id: id, reason: reason, dir: dir, rel: a.dirs.AreaName + "/" + id, sent: now, deadline: deadline,
		waiting: map[uint64]bool{}, answeredBy: map[uint64]bool{}, stop: stop}
	msg := r.message()
	dl := deadline.UTC()
	ranks, _, out := a.conns.JobRanks() // pkg/supervisor/internal/trainers: the job's declared ranks, and only they
	a.conns.WarnLeftOut(out)
	if err := a.dirs.handDir(a.log, id, ranks); err != nil {
		a.log.Error("cannot hand the checkpoint directory to the trainer's uid", zap.String("dir", dir), zap.Error(err))
		a.cfg.Metrics.Error("checkpoint")
		a.dirs.Area.Remove(id)
		a.commits.notAsked(now)
		return nil
	}
	for _, c := range ranks {
		if err := c.Post(msg); err != nil {
			a.log.Warn("checkpoint request not delivered", zap.Uint64("conn", c.ID()), zap.Error(err))
			continue
		}
		r.waiting[c.ID()] = true
	}
	if len(r.waiting) == 0 {
		a.dirs.Area.Remove(id)
		a.log.Warn("no trainer connected: checkpoint not requested", zap.String("reason", reason))
		a.commits.notAsked(now)
		return nil
	}
	a.commits.asked(r)
	a.log.Info("checkpoint requested", zap.String("id", id), zap.String("reason", reason),
		zap.Time("deadline", dl), zap.Int("trainers", len(r.waiting)), zap.Int("not_waited_for", len(out)))
	return r
}

// onDone handles a trainer's done: for a request, or unsolicited.
func (a *Agent) onDone(c *protocol.Conn, m protocol.Message) {
	if len(m.Metadata) > maxDoneMetadata || (len(m.Metadata) > 0 && !json.Valid(m.Metadata)) {
		a.conns.Reply(c, m.ID, "done: metadata must be a JSON object under 64 KiB")
		return
	}
	if m.Step == nil || *m.Step < 0 {
		a.conns.Reply(c, m.ID, "done: step is required and must be >= 0")
		return
	}
	if m.ID == "" {
		a.onUnsolicitedDone(c, m)
		return
	}
	r, ok := a.commits.pending[m.ID]
	if !ok || !r.waiting[c.ID()] {
		a.log.Warn("done for an unknown checkpoint id", zap.String("id", m.ID), zap.Uint64("conn", c.ID()))
		a.conns.Reply(c, m.ID, fmt.Sprintf("done: unknown checkpoint id %q", m.ID))
		return
	}
	delete(r.waiting, c.ID())
	a.conns.Answered(c.ID()) // pkg/supervisor/internal/trainers
	r.noteAnswer(c)          // the owner rule
	r.noteRank(c)
	r.answered++
	if *m.Step >= r.step {
		r.step = *m.Step
	}
	if len(m.Metadata) > 0 {
		r.metadata = m.Metadata
	}
	if m.BlockedMS != nil && *m.BlockedMS >= 0 {
		b := time.Duration(*m.BlockedMS) * time.Millisecond
		if r.blocked == nil || b > *r.blocked {
			r.blocked = &b
		}
	}
	if len(r.waiting) == 0 {
		if why := a.job.partMissing(r, a.conns.LocalWorld()); why != "" && r.lost == 0 && len(r.part.ranks) > 0 {
			// Another rank of this node will join (its hello came after
			// the request): the part waits for it, up to r's deadline.
			a.log.Info("part waits for this node's other ranks", zap.String("id", r.id), zap.String("why", why))
			return
		}
		a.settle(r)
	}
}

// settle is called when no connection owes r an answer any more.
func (a *Agent) settle(r *request) {
	a.commits.dropped(r.id)
	now := time.Now()
	if r.answered == 0 {
		a.dirs.removeDir(r, a.goBg, a.log)
		a.log.Warn("checkpoint abandoned: every trainer disconnected", zap.String("id", r.id))
		if r.stop != nil {
			a.stops.failed(r.stop, "trainer disconnected before saving", now, a.stopEnds())
		}
		return
	}
	why := a.job.lost(r)
	if why == "" && r.lost > 0 {
		// A rank that went away owing its answer may have left half its
		// files in the directory: the others' answers do not make it a
		// checkpoint (TestAgentSim seed 61 committed a crashed rank's
		// half file, and restore handed it out as verified).
		why = fmt.Sprintf("%d trainer(s) disconnected before saving: checkpoint abandoned", r.lost)
	}
	if why != "" {
		a.abandonPart(r, why, now) // job.go
		return
	}
	if why := a.job.partMissing(r, a.conns.LocalWorld()); why != "" {
		a.abandonPart(r, why+": job checkpoint abandoned", now)
		return
	}
	saved := now.Sub(r.sent)
	// δ is what the checkpoint cost training: the whole save, unless the
	// trainer saved in the background and said how long it was blocked.
	cost := saved
	if r.blocked != nil && *r.blocked < saved {
		cost = *r.blocked
	}
	a.cfg.Scheduler.ObserveCost(cost)
	a.cfg.Metrics.Phase("save", saved)
	a.commits.saved(saved, cost, now)
	if r.stop != nil {
		r.stop.saved(r.step, now)
	}
	a.commit(r)
}

// onUnsolicitedDone commits a checkpoint the trainer took on its own. Its
// directory must be inside the agent's checkpoint directory: a trainer can
// never make the agent upload anything else.
func (a *Agent) onUnsolicitedDone(c *protocol.Conn, m protocol.Message) {
	if a.stops.current != nil {
		a.conns.Reply(c, "", "done: an interruption checkpoint is in progress")
		return
	}
	if why := a.job.ownCheckpoint(); why != "" {
		// Said here too: the trainer may think its checkpoint (often its
		// SIGTERM's) is safe; only this log tells the operator it is not.
		a.log.Warn("trainer's own checkpoint refused: not committed", zap.Int64p("step", m.Step), zap.String("dir", m.Dir), zap.String("why", why))
		a.conns.Reply(c, "", why)
		return
	}
	rel, err := a.dirs.InsideCheckpointDir(m.Dir)
	var held *os.Root
	if err == nil {
		// Held from here to its removal: the commit reads this very
		// directory, whatever is renamed or swapped meanwhile.
		held, err = checkpoint.OpenDir(a.dirs.Root, rel)
	}
	if err != nil {
		a.log.Warn("unsolicited done refused", zap.String("dir", m.Dir), zap.Error(err))
		a.conns.Reply(c, "", "done: "+err.Error())
		return
	}
	dir := filepath.Join(a.cfg.CheckpointDir, filepath.FromSlash(rel))
	now := time.Now()
	// answeredBy: a trainer of another user uploads only its own files
	// (the owner rule, below), here as for a requested checkpoint.
	r := &request{id: localdirs.NewRequestID(), reason: protocol.ReasonManual, dir: dir, rel: rel, held: held, sent: now, deadline: now.Add(a.cfg.RequestTimeout),
		waiting: map[uint64]bool{}, answeredBy: map[uint64]bool{}, answered: 1, step: *m.Step, metadata: m.Metadata}
	r.noteAnswer(c) // the owner rule
	a.commits.unblocked(now)
	a.log.Info("trainer took a checkpoint on its own", zap.String("id", r.id), zap.Int64("step", r.step), zap.String("dir", dir))
	a.commit(r)
}

// commit starts uploading r. An urgent (interruption) commit cancels any
// periodic upload in flight: the newer checkpoint supersedes it and gets
// the whole bandwidth.
func (a *Agent) commit(r *request) {
	// A periodic commit gets a generous bound, so that a store outage ends
	// in upload_failed rather than a commit that never returns. The
	// interruption commit must end before the trainer is stopped at the
	// deadline, so that upload_failed can still reach it.
	bound := max(10*time.Minute, 4*a.cfg.Scheduler.EstimateUpload(a.commits.last.bytes))
	//
	// Both end with the agent's life too: the loop ends with an upload in
	// flight only when told to stop at once (a second signal, Run's ctx),
	// which does not wait for uploads.
	ctx, cancel := context.WithTimeout(a.life, bound)
	if r.stop != nil {
		cancel()
		ctx, cancel = context.WithDeadline(a.life, r.stop.deadline.Add(-a.cfg.Margin/2))
		a.commits.cancelPeriodic(a.log)
	}
	u := &upload{req: r, cancel: cancel, start: time.Now()}
	a.commits.uploading(u)
	var openErr error
	if r.held == nil {
		r.held, openErr = checkpoint.OpenDir(a.dirs.parentRoot(r), r.rel)
	}
	if r.step < a.commits.last.step {
		// Committed all the same (a trainer may have rolled back on
		// purpose), and retention keeps it; restore prefers the newest step.
		a.log.Warn("checkpoint is older than the newest committed one: committing it, but restore prefers the newest step",
			zap.String("id", r.id), zap.Int64("step", r.step), zap.Int64("newest_step", a.commits.last.step))
	}
	// Upload priority over other runs (node mode) comes only from this
	// machine's own notices: a join from a trainer is no notice, and a
	// pod could send one in a loop to starve its neighbours.
	ownNotice := r.stop != nil && !r.stop.joined
	// The owner rule: a trainer of another user uploads only its own files.
	req := commit.Request{Dir: r.dir, Root: r.held, ID: r.id, Step: r.step, Reason: r.reason, Metadata: r.metadata, Urgent: ownNotice, Pipeline: r.pipe,
		Part: a.job.partFor(r), Owners: r.ownerUIDs()}
	keep, st, log, results, life, dirs := a.cfg.Keep, a.cfg.Store, a.log, a.commits.results, a.life, &a.dirs
	report := func(cr commitResult) {
		select {
		case results <- cr:
		case <-life.Done(): // the loop has ended: nobody reads results
		}
	}
	a.goBgFail(func() {
		defer cancel()
		if openErr != nil {
			report(commitResult{req: r, err: fmt.Errorf("commit: %w", openErr)})
			return
		}
		res, err := a.commits.committer.Commit(ctx, req)
		if err == nil {
			dirs.keep(ctx, r, res, req.Part, r.stop == nil, log) // the local tier, before the loop removes the directory
		}
		report(commitResult{req: r, res: res, err: err})
		if err == nil {
			// After the report: the trainer hears of its commit, and a
			// stop goes on, without waiting for the store's deletes.
			// Never the checkpoint just committed, even when its step is
			// lower than the newest: the trainer was told it is durable.
			if _, perr := checkpoint.Prune(ctx, st, keep, log, res.ManifestKey); perr != nil && ctx.Err() == nil {
				log.Warn("retention failed", zap.Error(perr))
			}
		}
	}, func(err error) { report(commitResult{req: r, err: fmt.Errorf("commit: %w", err)}) })
}

func (a *Agent) onCommitResult(cr commitResult) {
	r := cr.req
	u := a.commits.uploadEnded(r.id)
	now := time.Now()
	a.dirs.removeDir(r, a.goBg, a.log)
	if cr.err != nil && a.onFencedCommit(r, cr.err) { // commits.go
		return
	}
	if cr.err != nil {
		switch {
		case errors.Is(cr.err, commit.ErrPreempted):
			a.log.Info("periodic checkpoint not committed: another run's interruption checkpoint took its upload slot", zap.String("id", r.id))
			a.cfg.Metrics.CommitFailed("preempted")
		case u != nil && u.cancelled && errors.Is(cr.err, context.Canceled):
			// Cancelled on purpose (commits.cancelPeriodic): no failure.
			a.log.Info("periodic checkpoint not committed: the interruption checkpoint took priority", zap.String("id", r.id))
			a.cfg.Metrics.CommitFailed("preempted")
		default:
			a.log.Error("checkpoint not committed", append([]zap.Field{zap.String("id", r.id), zap.String("reason", r.reason), zap.Error(cr.err)},
				causeFields(cr.err, "")...)...) // failcause.go
			a.cfg.Metrics.CommitFailed(r.reason)
		}
		a.conns.Broadcast(protocol.Message{Type: protocol.TypeUploadFailed, ID: r.id, Error: cr.err.Error()})
		if a.job.part() != "" {
			a.commits.partFailed(r) // commits.go
		}
		a.sess.JournalAsync(func(j *journal.Journal) { j.Stats.Failures++ })
		if r.stop != nil {
			a.stops.failed(r.stop, "upload: "+cr.err.Error(), now, a.stopEnds())
		}
		return
	}
	res := cr.res
	a.cfg.Scheduler.ObserveUpload(res.Upload, res.Bytes)
	a.cfg.Metrics.Uploaded(res.Bytes, res.Upload)
	a.cfg.Metrics.Phase("upload", res.Upload)
	a.cfg.Metrics.Phase("commit", now.Sub(u.start))
	a.cfg.Metrics.Committed(res.Manifest.Step, now)
	a.commits.promise.Note(r.reason, r.sent, r.pipe != nil, res, u.start, now, a.src.Asks()) // pkg/supervisor/promise
	pr := a.commits.promise.Estimate()
	a.commits.committedAs(r, res) // restore resumes from the newest step
	a.conns.Broadcast(protocol.Message{Type: protocol.TypeCommitted, ID: r.id, Step: &res.Manifest.Step, URI: a.cfg.Store.URI(res.ManifestKey)})
	cost, bps, ran, blocked := a.cfg.Scheduler.Cost().Seconds(), a.cfg.Scheduler.Throughput(), a.sess.RunSeconds(), a.commits.blocked
	if !r.costFrom.IsZero() {
		d := time.Since(r.costFrom)
		a.cfg.Scheduler.ObserveCost(d)
		cost = d.Seconds()
	}
	// In a job every node commits the checkpoint: the node that keeps the
	// schedule (rank 0's) counts it, so that the job's stats add up once.
	jobStats, session := asking(a.conns, a.job), a.sess.ID()
	a.sess.JournalAsync(func(j *journal.Journal) {
		if s := j.SessionByID(session); s != nil {
			s.BlockedSeconds = &blocked
		}
		if !jobStats {
			return
		}
		j.Stats.Checkpoints++
		j.Stats.CostSeconds, j.Stats.BytesPerSec, j.Stats.LastBytes = cost, bps, res.Bytes
		if pr.Source == "checkpoint" {
			j.Stats.SaveSeconds, j.Stats.CheckpointSeconds, j.Stats.Pipelined = pr.Save.Seconds(), pr.Took.Seconds(), pr.Pipelined
		}
		j.Stats.RunSeconds = ran
	})
	if r.stop != nil {
		a.stops.committed(r.stop, res, now, a.stopEnds())
	}
}

// requestExpired handles a request whose deadline passed unanswered.
func (a *Agent) requestExpired(r *request, now time.Time) {
	a.commits.dropped(r.id)
	a.log.Warn("trainer missed the checkpoint deadline", zap.String("id", r.id), zap.String("reason", r.reason),
		zap.Time("deadline", r.deadline), zap.Int("answered", r.answered), zap.Int("waiting", len(r.waiting)))
	a.cfg.Metrics.CommitFailed("deadline")
	if r.pipe != nil {
		r.pipe.Abort()
		a.goBg(r.pipe.Wait)
	}
	held := r.held
	r.held = nil
	a.goBg(func() {
		checkpoint.RemoveDir(a.dirs.parentRoot(r), r.rel, held)
		if held != nil {
			held.Close()
		}
	})
	if r.stop != nil {
		a.stops.failed(r.stop, "trainer missed the deadline", now, a.stopEnds())
	}
}

func (a *Agent) onFailed(c *protocol.Conn, m protocol.Message) {
	r, ok := a.commits.pending[m.ID]
	if !ok || !r.waiting[c.ID()] {
		a.conns.Reply(c, m.ID, "failed: unknown checkpoint id "+m.ID)
		return
	}
	// The cause named (ENOSPC, EACCES, ...) with what to do about it.
	a.log.Warn("trainer could not save the checkpoint", append([]zap.Field{zap.String("id", m.ID), zap.String("error", m.Error),
		zap.String("reason", r.reason)}, causeFields(nil, m.Error)...)...) // failcause.go
	a.cfg.Metrics.CommitFailed("trainer")
	a.commits.dropped(r.id)
	a.dirs.removeDir(r, a.goBg, a.log) // what the failed save left would keep a full disk full
	now := time.Now()
	a.commits.unblocked(now)
	if r.stop != nil {
		a.stops.failed(r.stop, "trainer failed: "+m.Error, now, a.stopEnds())
	}
}

// noteAnswer records that c answered r, with its uid as it connected: the
// owner rule must hold for a trainer that has disconnected since (the
// commit starts once the last trainer answers).
func (r *request) noteAnswer(c *protocol.Conn) {
	r.answeredBy[c.ID()] = true
	if r.answerUIDs == nil {
		r.answerUIDs = map[uint64][]int{}
	}
	r.answerUIDs[c.ID()] = foreignUID(c)
}

// ownerUIDs are the uids every file of r must be owned by (its commit's
// Owners): those of the trainers that answered it, nil when one of them
// is the agent's own user (or its uid is unknown), whether or not it is
// still connected. A trainer of another user then cannot make the agent
// read a file it could not read itself (a hard link, another's file).
func (r *request) ownerUIDs() []int {
	var uids []int
	for cid := range r.answeredBy {
		uid := r.answerUIDs[cid]
		if uid == nil {
			return nil
		}
		uids = append(uids, uid...)
	}
	return uids
}

// foreignUID is c's peer uid when it is another user's than the agent's
// (the owner a file it reports saved must have: commit.Pipeline.Add);
// nil when it is the agent's own user, or unknown.
func foreignUID(c *protocol.Conn) []int {
	uid := c.PeerUID()
	if uid < 0 || uid == os.Geteuid() {
		return nil
	}
	return []int{uid}
}

// warnEvery bounds how often a condition that persists is said again: at
// once, then at most once per warnEvery while it lasts.
const warnEvery = 5 * time.Minute

// UnansweredAfter is how long a periodic checkpoint request may go
// unanswered before the agent warns that the trainer is not answering:
// two intervals, and never under 10 s nor under four times the newest
// measured save, save (a slow save is no deaf trainer). docs/operations.md
// states it.
func UnansweredAfter(interval, cost time.Duration) time.Duration {
	return max(2*interval, 10*time.Second, 4*cost)
}

// silence is what the agent says when it would otherwise be silent: no
// trainer to ask when a checkpoint is due, or a request nobody answers
// (the trainer does not call poll). Each is said at once, then at a
// bounded rate (warnEvery) while it lasts; the metrics carry it between.
// The loop tells it what it sees (noTrainer, unanswered); it owns when
// each was last said.
type silence struct {
	noTrainerSince time.Time            // the start of the unprotected span under way (zero: none)
	noTrainerSaid  time.Time            // the last warning of it
	unprotected    time.Duration        // the spans ended so far (the journal's unprotected_seconds)
	unansweredSaid map[string]time.Time // request id → the last warning of it
	overdue        int                  // requests unanswered past UnansweredAfter, at the last look
	awaitedSince   time.Time            // a trainer awaited since, none connected in this session yet (zero: none awaited)
	notYetSaid     bool                 // that none has connected yet was said (once a session)
}

// notYet is told, at each tick, whether a trainer is awaited that has
// not connected in this session (its process runs, or the agent is a
// sidecar). Past after since it was first told so, it warns, once: the
// first checkpoint may be an hour away (the auto interval's), and until
// then noTrainer would say nothing of a trainer that never connects.
func (s *silence) notYet(awaited bool, now time.Time, after time.Duration, v silentView, log *zap.Logger) {
	if !awaited {
		s.awaitedSince = time.Time{}
		return
	}
	if s.awaitedSince.IsZero() {
		s.awaitedSince = now
	}
	if s.notYetSaid || now.Sub(s.awaitedSince) < after {
		return
	}
	s.notYetSaid = true
	log.Warn("no trainer has connected yet: nothing is checkpointed until one does",
		zap.Float64("waited_s", now.Sub(s.awaitedSince).Seconds()), zap.String("socket", v.socket), zap.String("fix", v.fix()))
}

// noTrainer is told, at each tick, whether a periodic checkpoint is due
// (now) with no trainer connected to ask it of. It warns at once, and
// then every warnEvery, and says so when a trainer is back.
func (s *silence) noTrainer(due bool, now time.Time, v silentView, log *zap.Logger) {
	if !due {
		if !s.noTrainerSince.IsZero() {
			s.unprotected += now.Sub(s.noTrainerSince)
			if v.trainers > 0 {
				log.Info("a trainer connected: periodic checkpoints resume",
					zap.Float64("unprotected_s", now.Sub(s.noTrainerSince).Seconds()))
			}
		}
		s.noTrainerSince, s.noTrainerSaid = time.Time{}, time.Time{}
		return
	}
	if s.noTrainerSince.IsZero() {
		// Unprotected since the last commit (or the session's start), not
		// only since the checkpoint fell due.
		s.noTrainerSince = v.since
	}
	if !s.noTrainerSaid.IsZero() && now.Sub(s.noTrainerSaid) < warnEvery {
		return
	}
	s.noTrainerSaid = now
	fields := []zap.Field{zap.String("socket", v.socket), zap.String("fix", v.fix()),
		zap.Float64("unprotected_s", now.Sub(s.noTrainerSince).Seconds()), zap.Duration("repeat_every", warnEvery)}
	log.Warn("no trainer connected: checkpoints are not being taken, and an interruption now would lose "+v.loses(), append(fields, v.committedFields()...)...)
}

// unprotectedSeconds is the session's time with no trainer to checkpoint
// when one was due, to now.
func (s *silence) unprotectedSeconds(now time.Time) float64 {
	d := s.unprotected
	if !s.noTrainerSince.IsZero() {
		d += now.Sub(s.noTrainerSince)
	}
	return d.Seconds()
}

// unanswered is told, at each tick, the periodic requests still waiting
// for an answer; it warns of each past after (UnansweredAfter), at once
// and then every warnEvery, and returns how many are past it.
func (s *silence) unanswered(reqs map[string]*request, after time.Duration, now time.Time, v silentView, log *zap.Logger) int {
	n := 0
	for id, r := range reqs {
		if r.urgent() || len(r.waiting) == 0 || now.Sub(r.sent) < after {
			continue
		}
		n++
		if said, ok := s.unansweredSaid[id]; ok && now.Sub(said) < warnEvery {
			continue
		}
		if s.unansweredSaid == nil {
			s.unansweredSaid = map[string]time.Time{}
		}
		s.unansweredSaid[id] = now
		fields := []zap.Field{zap.String("id", id), zap.Float64("waited_s", now.Sub(r.sent).Seconds()), zap.Duration("warn_after", after),
			zap.Int("waiting", len(r.waiting)), zap.Time("deadline", r.deadline),
			zap.String("fix", "the training loop must call agent.poll(step) every step and answer a request with req.done(step) or req.fail(error)")}
		log.Warn("trainer has not answered the checkpoint request: an interruption now would lose "+v.loses(), append(fields, v.committedFields()...)...)
	}
	for id := range s.unansweredSaid {
		if _, ok := reqs[id]; !ok {
			delete(s.unansweredSaid, id)
		}
	}
	s.overdue = n
	return n
}

// nextWake is when the next warning could be due (zero: none is
// pending): after is the unanswered requests' bound, connect notYet's.
func (s *silence) nextWake(reqs map[string]*request, after, connect time.Duration) time.Time {
	var wake time.Time
	earlier := func(t time.Time) {
		if wake.IsZero() || t.Before(wake) {
			wake = t
		}
	}
	if !s.noTrainerSaid.IsZero() {
		earlier(s.noTrainerSaid.Add(warnEvery))
	}
	if !s.notYetSaid && !s.awaitedSince.IsZero() {
		earlier(s.awaitedSince.Add(connect))
	}
	for id, r := range reqs {
		if r.urgent() || len(r.waiting) == 0 {
			continue
		}
		if said, ok := s.unansweredSaid[id]; ok {
			earlier(said.Add(warnEvery))
		} else {
			earlier(r.sent.Add(after))
		}
	}
	return wake
}

// silentView is what the warnings say of the run: its socket, whether the
// trainer is a sidecar's neighbour, and the newest committed checkpoint.
type silentView struct {
	socket    string
	sidecar   bool
	trainers  int
	since     time.Time // the newest committed checkpoint's training time, else the session's start
	committed bool      // the run has a committed checkpoint (this session's or a restored one)
	step      int64
}

// fix is what makes a trainer connect.
func (v silentView) fix() string {
	if v.sidecar {
		return "set SPOTAGENT_SOCKET=" + v.socket + " in the trainer container and mount the volume that holds the socket (the sidecar's shared emptyDir), then call spotagent.connect()"
	}
	return "the trainer must call spotagent.connect() with SPOTAGENT_SOCKET in its environment (spotagent run sets it; env -u, sudo or a wrapper that clears the environment drops it)"
}

// loses says what an interruption would lose now.
func (v silentView) loses() string {
	if !v.committed {
		return "everything: nothing was ever committed"
	}
	return "the work since the last committed checkpoint"
}

func (v silentView) committedFields() []zap.Field {
	if !v.committed {
		return []zap.Field{zap.Bool("ever_committed", false)}
	}
	return []zap.Field{zap.Int64("committed_step", v.step)}
}

// checkSilence tells the agent's silence what the loop sees, at each tick
// (agent_loop.go), and sets the gauges that carry it between warnings.
func (a *Agent) checkSilence(now time.Time) {
	v := silentView{socket: a.cfg.Server.Path, sidecar: len(a.cfg.Command) == 0, trainers: a.trainers(),
		since: a.commits.last.trainedAt, committed: a.commits.last.id != "", step: a.commits.last.step}
	if v.since.IsZero() {
		v.since = a.sess.Started()
	}
	a.silent.noTrainer(a.noTrainerDue(now, v.trainers), now, v, a.log)
	a.silent.notYet(a.trainerAwaited(), now, a.cfg.ConnectWarnAfter, v, a.log)
	n := a.silent.unanswered(a.commits.pending, a.unansweredAfter(), now, v, a.log)
	a.cfg.Metrics.Trainers(a.conns.Count(), a.commits.lastStep, n)
}

// noTrainerDue: a periodic checkpoint is due and nobody can be asked,
// while the trainer should be there (its process runs, or for a sidecar
// at all times) and nothing else explains it (a restore, a stop, a
// trainer that said it finished).
func (a *Agent) noTrainerDue(now time.Time, trainers int) bool {
	if trainers > 0 || !a.src.Asks() || a.stops.current != nil || a.conns.Finished() {
		return false
	}
	if a.boot.Busy() || a.boot.Failed() || a.boot.Aborted() { // a restore runs (pkg/supervisor/internal/bootrestore)
		return false
	}
	if len(a.cfg.Command) > 0 && !a.proc.Running() {
		return false // exited, or waiting to restart: said by the child's own lines
	}
	if len(a.cfg.Command) == 0 && a.cfg.EndWhenIdle && a.conns.Had() {
		return false // a node agent's run ends with its trainers
	}
	return a.cfg.Scheduler.Due(now, a.commits.lastBlock, false)
}

// trainerAwaited: a trainer should connect and none has in this session
// (its process runs; a sidecar's at all times), and nothing else
// explains it (a stop, a trainer that finished, zero-code mode).
func (a *Agent) trainerAwaited() bool {
	if a.conns.Had() || !a.src.Asks() || a.stops.current != nil || a.conns.Finished() {
		return false
	}
	if len(a.cfg.Command) > 0 {
		return a.proc.Running()
	}
	return !a.cfg.EndWhenIdle
}

func (a *Agent) unansweredAfter() time.Duration {
	return UnansweredAfter(a.cfg.Scheduler.Interval(), a.commits.saveTook)
}

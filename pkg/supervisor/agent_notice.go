package supervisor

import (
	"context"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/protocol"
)

// stopSequence is the notices and signals this session got, and the stop
// sequence under way (current, nil: none).
type stopSequence struct {
	current     *stopState
	noticesSeen int
	lastNotice  *metadata.Notice
	signals     int       // SIGTERM/SIGINT received: 1 is a shutdown, 2 ends at once
	firstSignal time.Time // when the first of them came (SignalWindow)

	// What a stop's end touches: the trainers are told, the session's
	// journal records it, the newest commit and the source count what
	// was lost; the cloud's event is acknowledged within life.
	cfg     *Config
	life    context.Context
	conns   *trainerConns
	sess    *session
	commits *commits
	src     checkpointSource
}

// lateNoticeGrace is the deadline given to a termination notice whose own
// deadline has already passed when the agent sees it: short, because the
// machine may go at any moment, but long enough for a small checkpoint.
const lateNoticeGrace = 10 * time.Second

// stopState is the interruption (or shutdown) in progress.
type stopState struct {
	notice   metadata.Notice
	reason   string    // interruption | shutdown
	deadline time.Time // the machine (or the grace) ends here
	req      *request
	stopSent bool
	told     bool // a trainer got the stop message (exitCodeFor)
	finished bool // committed or failed: nothing more to wait for
	joined   bool // the notice reached another node of the job (agent_job.go)
	record   checkpoint.Interruption
}

func (a *Agent) onEvent(ev protocol.Event) {
	c, m := ev.Conn, ev.Msg
	switch m.Type {
	case protocol.TypeHello:
		a.onHello(c, m)
	case protocol.TypeProgress:
		a.commits.seeStep(m.Step)
	case protocol.TypeDone:
		a.commits.seeStep(m.Step)
		a.onDone(c, m)
	case protocol.TypeSaved:
		a.onSaved(c, m) // agent_pipeline.go
	case protocol.TypeFailed:
		a.onFailed(c, m)
	case protocol.TypeJoin:
		a.onJoin(c, m) // agent_job.go
	case protocol.TypeStatus:
		a.conns.sendStatus(c, a.status())
	case protocol.TypeBye:
		a.commits.seeStep(m.Step)
		if _, ok := a.conns.byID[c.ID()]; ok {
			a.conns.saidBye[c.ID()] = true
			a.conns.byes++
		}
	case protocol.TypeDisconnected:
		a.boot.forget(c.ID())                                                                                        // agent_restore.go
		a.ranks.connEnded(c, a.conns.saidBye[c.ID()], a.stops.current != nil, a.proc.running(), a.dirs.exitFileSays) // agent_peers.go
		if _, ok := a.conns.byID[c.ID()]; ok && !a.conns.saidBye[c.ID()] {
			a.conns.leftUnfinished = true
		}
		delete(a.conns.saidBye, c.ID())
		delete(a.conns.byID, c.ID())
		for _, r := range a.commits.pending {
			if r.waiting[c.ID()] {
				delete(r.waiting, c.ID())
				r.lost++
				if len(r.waiting) == 0 {
					a.settle(r)
				}
			}
		}
	}
}

func (a *Agent) onHello(c *protocol.Conn, m protocol.Message) {
	if w, handled := a.boot.hello(protocol.Event{Conn: c, Msg: m}, &a.cfg); handled { // agent_restore.go
		if w != nil {
			a.admit(c, m, *w)
		}
		return
	}
	a.admit(c, m, a.cfg.welcome(m, a.boot.resume))
}

// admit sends the welcome w answering hello m and counts c as a trainer.
func (a *Agent) admit(c *protocol.Conn, m protocol.Message, w protocol.Message) {
	if err := c.Post(w); err != nil {
		a.log.Warn("welcome not delivered", zap.Uint64("conn", c.ID()), zap.Error(err))
		return
	}
	if len(a.conns.byID) == 0 {
		a.conns.leftUnfinished = false // a new start of the trainer(s)
	}
	a.conns.byID[c.ID()] = c
	a.conns.had = true
	fields := []zap.Field{zap.Uint64("conn", c.ID()), zap.Int("pid", m.PID), zap.Int("peer_uid", c.PeerUID())}
	if m.Rank != nil {
		fields = append(fields, zap.Int("rank", *m.Rank))
	}
	a.log.Info("trainer connected", fields...)
	a.job.hello(m, &a.conns, a.log)                          // job_policy.go
	a.ranks.hello(m, a.proc.running())                       // agent_peers.go
	a.live.start(m, &a.cfg, a.job.part(), a.sess.id, a.life) // agent_liveness.go
	// A trainer that connects during an interruption is told at once.
	if s := a.stops.current; s != nil && s.stopSent {
		s.told = true
		c.Post(s.stopMessage())
	}
}

func (a *Agent) onFailed(c *protocol.Conn, m protocol.Message) {
	r, ok := a.commits.pending[m.ID]
	if !ok || !r.waiting[c.ID()] {
		a.conns.reply(c, m.ID, "failed: unknown checkpoint id "+m.ID)
		return
	}
	a.log.Warn("trainer could not save the checkpoint", zap.String("id", m.ID), zap.String("error", m.Error))
	a.cfg.Metrics.CommitFailed("trainer")
	delete(a.commits.pending, r.id)
	a.dirs.removeDir(r, a.goBg, a.log) // what the failed save left would keep a full disk full
	now := time.Now()
	a.commits.lastBlock = now
	if r.stop != nil {
		a.stops.failed(r.stop, "trainer failed: "+m.Error, now)
	}
}

// onNotice reacts to a notice from the cloud or a signal.
func (a *Agent) onNotice(n metadata.Notice) {
	now := time.Now()
	a.stops.noticesSeen++
	a.stops.lastNotice = &n
	a.cfg.Metrics.Notice(string(n.Cloud), string(n.Kind))
	fields := []zap.Field{zap.String("cloud", string(n.Cloud)), zap.String("kind", string(n.Kind)), zap.String("id", n.ID),
		zap.String("action", n.Action), zap.Time("detected", n.Detected)}
	if !n.Deadline.IsZero() {
		fields = append(fields, zap.Time("deadline", n.Deadline), zap.Duration("left", n.Deadline.Sub(now).Round(time.Millisecond)))
	}
	a.log.Info("interruption notice", fields...)
	switch n.Kind {
	case metadata.KindTermination:
		if a.boot.aborted != nil {
			return // the start was given up: nothing to save
		}
		if n.Cloud != metadata.CloudSignal && a.abortStart("interruption notice", &startAbort{notice: true}) { // agent_restore.go
			return
		}
		reason := protocol.ReasonInterruption
		if n.Cloud == metadata.CloudSignal {
			reason = protocol.ReasonShutdown
		}
		a.beginStop(n, reason, now)
	case metadata.KindRebalance:
		a.cfg.Scheduler.Hazard(now, string(n.Kind), time.Time{})
		if a.cfg.OnRebalance == "checkpoint" && a.stops.current == nil && len(a.commits.pending) == 0 && len(a.commits.uploads) == 0 && a.job.asksPeriodic(a.conns.byID) {
			a.request(protocol.ReasonPeriodic, now.Add(a.cfg.RequestTimeout), nil)
		}
	case metadata.KindMaintenance:
		a.cfg.Scheduler.Hazard(now, string(n.Kind), n.Deadline)
	case metadata.KindCancelled:
		a.cfg.Scheduler.Hazard(now, string(n.Kind), time.Time{})
		if s := a.stops.current; s != nil && s.notice.ID == n.ID && !s.stopSent {
			a.log.Info("termination notice withdrawn before the trainer was stopped: carrying on", zap.String("id", n.ID))
			if s.req != nil {
				s.req.stop = nil
			}
			a.stops.current = nil
		}
	}
}

// beginStop starts (or tightens) the interruption sequence: checkpoint with
// a deadline that leaves room to upload, commit, stop, then the child.
func (a *Agent) beginStop(n metadata.Notice, reason string, now time.Time) {
	deadline := n.Deadline
	if deadline.IsZero() {
		deadline = now.Add(a.cfg.TermGrace)
	}
	if !deadline.After(now) {
		// Seen late (a slow poll, a metadata outage, clocks that disagree):
		// the machine may still live a moment. Try a checkpoint anyway
		// rather than stop the trainer at once with nothing saved.
		a.log.Warn("notice deadline already passed: trying a best-effort checkpoint",
			zap.Time("notice_deadline", deadline), zap.Duration("grace", lateNoticeGrace))
		deadline = now.Add(lateNoticeGrace)
	}
	if s := a.stops.current; s != nil {
		if deadline.Before(s.deadline) {
			a.log.Info("earlier deadline: tightening the interruption", zap.Time("deadline", deadline))
			s.deadline = deadline
		}
		return
	}
	id := a.cfg.Identity
	s := &stopState{notice: n, reason: reason, deadline: deadline, record: checkpoint.Interruption{
		Cloud: string(n.Cloud), Kind: string(n.Kind), Action: n.Action, NoticeID: n.ID,
		InstanceID: id.InstanceID, InstanceType: id.InstanceType, Zone: id.Zone,
		Notice: n.Detected.UTC(), Detected: n.Detected.UTC(),
	}}
	if !n.Deadline.IsZero() {
		d := n.Deadline.UTC()
		s.record.Deadline = &d
	}
	a.stops.current = s
	reqDeadline := a.cfg.requestDeadline(a.commits.last.bytes, deadline, now)
	if a.src.stop(s, reqDeadline, now) { // the source takes it (zero-code mode)
		return
	}
	if a.conns.finished() {
		// A sidecar outlives its trainer: the kubelet stops it after the
		// trainer exited 0. Nothing was interrupted and nothing is lost.
		a.log.Info("the trainer finished its work (bye): nothing to checkpoint, nothing interrupted", zap.String("reason", reason))
		s.finished, s.stopSent = true, true // no stop to send, nothing to journal
		return
	}
	if a.trainers() == 0 {
		a.log.Warn("no trainer connected: nothing to checkpoint before the deadline")
		a.stops.failed(s, "no trainer connected", now)
		return
	}
	// A periodic request the trainer has not answered yet becomes the
	// interruption checkpoint: asking again would make it save twice.
	for _, r := range a.commits.pending {
		if r.stop == nil {
			r.stop, r.reason = s, reason
			if reqDeadline.Before(r.deadline) {
				r.deadline = reqDeadline
			}
			a.stops.requested(s, r, now)
			a.log.Info("the pending periodic checkpoint becomes the interruption checkpoint", zap.String("id", r.id), zap.Time("deadline", r.deadline))
			if a.job.ranksAgree() {
				// The ranks agree on the request's reason and deadline:
				// tell them the new ones (a client updates it in place).
				for cid := range r.waiting {
					if c := a.conns.byID[cid]; c != nil {
						c.Post(r.message())
					}
				}
			}
			return
		}
	}
	r := a.request(reason, reqDeadline, s)
	if r == nil {
		a.stops.failed(s, "checkpoint request not delivered", now)
		return
	}
	a.stops.requested(s, r, r.sent)
}

func (s *stopState) stopMessage() protocol.Message {
	dl := s.deadline.UTC()
	return protocol.Message{Type: protocol.TypeStop, Reason: s.reason, Deadline: &dl}
}

// tick enforces the interruption's deadlines: past the notice deadline
// the child gets SIGTERM (SIGKILL after KillAfter).
// The trainer is stopped by the loop (stopAtDeadline) when tick reports
// the deadline passed.
func (q *stopSequence) tick(now time.Time) (deadlinePassed bool) {
	s := q.current
	if s == nil || now.Before(s.deadline) {
		return false
	}
	if !s.finished {
		q.failed(s, "deadline passed", now)
	}
	return true
}

func (s *stopState) send(t *trainerConns) {
	if s.stopSent {
		return
	}
	s.stopSent = true
	s.told = len(t.byID) > 0
	t.broadcast(s.stopMessage())
}

// noticeOutcome reports a cloud notice's checkpoint to the metrics: not a
// shutdown, a fence or another node's notice joined here.
func (s *stopState) noticeOutcome(m Metrics, committed bool, now time.Time) {
	if s.joined || s.reason != protocol.ReasonInterruption {
		return
	}
	var lead time.Duration
	if !s.notice.Deadline.IsZero() {
		lead = s.notice.Deadline.Sub(s.notice.Detected)
	}
	m.NoticeCheckpoint(committed, now.Sub(s.notice.Detected), lead)
}

// recordLostSteps records the steps past committed that the trainer
// reached, as the checkpoint source counts them.
func (s *stopState) recordLostSteps(src checkpointSource, committed int64, now time.Time) {
	reached, from := src.reached(now)
	s.record.LostSteps, s.record.LostStepsFrom = max(reached-committed, 0), from
}

// requestDeadline is when the trainer must have saved a checkpoint that
// must commit by deadline: room is left to upload (the previous
// checkpoint's size at the measured throughput) and for the margin; if
// that leaves too little, the time is split in two.
func (c *Config) requestDeadline(lastBytes int64, deadline, now time.Time) time.Time {
	upload := c.Scheduler.EstimateUpload(lastBytes)
	reqDeadline := deadline.Add(-upload - c.Margin)
	if reqDeadline.Sub(now) < deadline.Sub(now)/2 {
		reqDeadline = now.Add(deadline.Sub(now) / 2)
	}
	return reqDeadline
}

// requested records that r, asked for at sent, is s's checkpoint.
func (q *stopSequence) requested(s *stopState, r *request, sent time.Time) {
	s.req = r
	at := sent.UTC()
	s.record.Requested, s.record.CheckpointID = &at, r.id
	q.cfg.Metrics.NoticeToRequest(sent.Sub(s.notice.Detected))
}

// committed: the interruption checkpoint is safe. Tell the trainer to
// stop, acknowledge the cloud's event, record it.
func (q *stopSequence) committed(s *stopState, res *checkpoint.Result, now time.Time) {
	t := now.UTC()
	s.record.Committed, s.record.CommitOK, s.record.Bytes = &t, true, res.Bytes
	s.recordLostSteps(q.src, res.Manifest.Step, now)
	s.noticeOutcome(q.cfg.Metrics, true, now)
	q.cfg.Log.Info("interruption checkpoint committed: stopping the trainer", zap.Int64("step", res.Manifest.Step),
		zap.Duration("notice_to_commit", now.Sub(s.notice.Detected).Round(time.Millisecond)), zap.Time("deadline", s.deadline))
	q.finish(s)
	if acker, ok := q.cfg.Source.(metadata.Acker); ok && s.notice.Cloud == q.cfg.Source.Cloud() {
		q.sess.acks.Add(1)
		go func(id string) {
			defer q.sess.acks.Done()
			// Outlives the loop, up to the notice's deadline (awaitLanding).
			ctx, cancel := context.WithDeadline(context.WithoutCancel(q.life), s.deadline)
			defer cancel()
			if err := acker.Ack(ctx, id); err != nil {
				q.cfg.Log.Warn("could not acknowledge the event", zap.String("id", id), zap.Error(err))
				return
			}
			q.cfg.Log.Info("event acknowledged", zap.String("id", id))
		}(s.notice.ID)
	}
}

// failed: no new checkpoint will commit before the deadline. The
// previous committed checkpoint stands; the work since then is lost.
func (q *stopSequence) failed(s *stopState, why string, now time.Time) {
	if s.finished {
		return
	}
	s.record.Error = why
	base := q.commits.last.trainedAt
	if base.IsZero() {
		base = q.sess.started
	}
	s.record.LostSeconds = now.Sub(base).Seconds()
	s.recordLostSteps(q.src, q.commits.last.step, now)
	s.noticeOutcome(q.cfg.Metrics, false, now)
	q.cfg.Log.Warn("interruption checkpoint did not commit: the previous checkpoint stands",
		zap.String("why", why), zap.Int64("committed_step", q.commits.last.step), zap.Int64("lost_steps", s.record.LostSteps),
		zap.Float64("lost_seconds", s.record.LostSeconds))
	q.finish(s)
}

func (q *stopSequence) finish(s *stopState) {
	s.finished = true
	s.send(q.conns)
	if s.joined {
		return // the node that got the notice journals it
	}
	rec := s.record
	committed := rec.CommitOK
	q.sess.journalAsync(func(j *checkpoint.Journal) {
		j.Interruptions = append(j.Interruptions, rec)
		if committed {
			j.Stats.NoticeCommits++
		}
	})
}

// exitCodeFor maps the trainer's exit code to the agent's (the table is in
// docs/protocol.md "Exit codes"). A trainer that exits 0 before anything
// told it to stop finished: 0, even during a stop. After an
// interruption or shutdown (a stop sequence ran) the run is to be continued
// elsewhere: a trainer that exited 0 or ExitInterrupted, or that the agent
// itself had to SIGTERM/SIGKILL at the stop deadline, makes the agent exit
// ExitInterrupted (the previous committed checkpoint stands). Any other code
// (a trainer that crashed on its own, or one stopped by a second signal)
// passes through, as it does without a stop, except a launcher's 1 after
// the stop's checkpoint committed and its ranks were told to stop
// (torchrun turns its workers' 75 into 1). Without a stop, ranks that
// ended because a peer of the job is gone make it ExitInterrupted too
// (agent_peers.go).
func (q *stopSequence) exitCodeFor(code int, p *process, d *localDirs, w *rankWatch) int {
	s := q.current
	if s == nil {
		return w.peerLossExit(code) // agent_peers.go: 75 when the ranks lost a peer
	}
	if s.reason != protocol.ReasonInterruption && s.reason != protocol.ReasonShutdown {
		return code
	}
	// In --signal mode the stop's checkpoint signal is the trainer's only
	// word of the stop (frameworks exit after a save on signal): told.
	told := s.told || (q.cfg.Signal != 0 && s.req != nil)
	if code == 0 && !told && !p.deadlineKill && !p.killing {
		// Nothing told it to stop (it said bye, or ended on its own before
		// the stop reached it): it finished its work. Run again, it would
		// repeat a completed job.
		q.cfg.Log.Info("trainer exited 0 before anything told it to stop: it finished; exiting 0", zap.String("reason", s.reason))
		return 0
	}
	switch {
	case code == 0, code == ExitInterrupted:
		return ExitInterrupted
	case p.deadlineKill && q.signals < 2 && (code == 128+int(syscall.SIGTERM) || code == 128+int(syscall.SIGKILL) || code == 1):
		// torchrun answers the group's SIGTERM with 1, never 143.
		return ExitInterrupted
	case code == 1 && s.stopSent && !s.record.CommitOK && d.childSaid75():
		// The checkpoint did not commit (the previous one stands), the
		// ranks were stopped and said 75: a single trainer would exit 75.
		q.cfg.Log.Info("trainer exited 1 after its ranks were stopped and wrote 75 to " + exitFileEnv + ": exiting 75")
		return ExitInterrupted
	case code == 1 && s.record.CommitOK && s.stopSent:
		// torchrun reports workers that exited 75 as its own exit 1
		// (docs/distributed.md has the measurements); the checkpoint is
		// committed and every rank was told to stop: run me again.
		q.cfg.Log.Info("trainer exited 1 after the checkpoint committed and its ranks were stopped (torchrun reports its workers' 75 as 1): exiting 75")
		return ExitInterrupted
	case code == 1 && w.env.part:
		return w.stopLauncherExit(code) // agent_interrupted.go (#37 item 4)
	}
	return code
}

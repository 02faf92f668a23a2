package supervisor

// The stop, top to bottom: a notice or a signal (signalNotice) reaches
// the loop (onNotice) and a stop begins (beginStop); the stop sequence
// (stopSequence, stopState) asks the trainer for its last checkpoint,
// keeps the deadline, takes the commit's result or failure, tells the
// trainer to stop, and ends; the agent's exit code after it (exitCodeFor).

import (
	"context"
	"os"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint/commit"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/bootrestore"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/childproc"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/localdirs"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/ranks"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/session"
	"github.com/spotagent/spotagent/pkg/supervisor/internal/trainers"
	"github.com/spotagent/spotagent/pkg/supervisor/source"
)

// signalNotice turns SIGTERM/SIGINT into a shutdown notice.
func signalNotice(sig os.Signal, grace time.Duration) metadata.Notice {
	now := time.Now()
	name := sig.String()
	if s, ok := sig.(syscall.Signal); ok && s == syscall.SIGTERM {
		name = "SIGTERM"
	}
	return metadata.Notice{Cloud: metadata.CloudSignal, Kind: metadata.KindTermination, ID: "signal-" + name,
		Deadline: now.Add(grace), Detected: now, Action: name}
}

// onNotice reacts to a notice from the cloud or a signal.
func (a *Agent) onNotice(n metadata.Notice) {
	now := time.Now()
	a.stops.noticed(n)
	a.cfg.Metrics.Notice(string(n.Cloud), string(n.Kind))
	fields := []zap.Field{zap.String("cloud", string(n.Cloud)), zap.String("kind", string(n.Kind)), zap.String("id", n.ID),
		zap.String("action", n.Action), zap.Time("detected", n.Detected)}
	if !n.Deadline.IsZero() {
		fields = append(fields, zap.Time("deadline", n.Deadline), zap.Float64("left_s", n.Deadline.Sub(now).Round(time.Millisecond).Seconds()))
	}
	a.log.Info("interruption notice", fields...)
	switch n.Kind {
	case metadata.KindTermination:
		if a.boot.Aborted() {
			return // the start was given up: nothing to save
		}
		if n.Cloud != metadata.CloudSignal && a.abortStart("interruption notice", &bootrestore.Abort{Notice: true}) { // restore.go
			return
		}
		reason := protocol.ReasonInterruption
		if n.Cloud == metadata.CloudSignal {
			reason = protocol.ReasonShutdown
		}
		backingOff := !a.proc.RestartAt().IsZero()
		if a.boot.CancelRestart(reason) || backingOff { // pkg/supervisor/internal/bootrestore: its partial directory goes
			// The trainer is not started again (in its restart's backoff
			// or restore) and the stop goes on as when none runs. The run
			// was interrupted before its trainer could try again: run me
			// again, not the failed one's code.
			a.proc.CancelRestart()
			a.proc.GiveUp()
			a.proc.ExitAs(ExitInterrupted)
		}
		a.beginStop(n, reason, now)
	case metadata.KindRebalance:
		a.cfg.Scheduler.Hazard(now, string(n.Kind), time.Time{})
		if a.cfg.OnRebalance == "checkpoint" && a.stops.current == nil && len(a.commits.pending) == 0 && len(a.commits.uploads) == 0 && asking(a.conns, a.job) {
			a.request(protocol.ReasonPeriodic, now.Add(a.cfg.RequestTimeout), nil)
		}
	case metadata.KindMaintenance:
		a.cfg.Scheduler.Hazard(now, string(n.Kind), n.Deadline)
	case metadata.KindCancelled:
		a.cfg.Scheduler.Hazard(now, string(n.Kind), time.Time{})
		if a.stops.withdraw(n.ID) {
			a.log.Info("termination notice withdrawn before the trainer was stopped: carrying on", zap.String("id", n.ID))
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
	if a.stops.current != nil {
		if a.stops.tighten(deadline) {
			a.log.Info("earlier deadline: tightening the interruption", zap.Time("deadline", deadline))
		}
		return
	}
	s := newStop(n, reason, deadline, a.cfg.Identity) // stop.go
	a.stops.begin(s)
	reqDeadline := a.cfg.RequestDeadline(a.commits.last.bytes, deadline, now)
	if a.src.Stop(s, reqDeadline, now) { // the source takes it (zero-code mode)
		return
	}
	if a.conns.Finished() {
		// A sidecar outlives its trainer: the kubelet stops it after the
		// trainer exited 0. Nothing was interrupted and nothing is lost.
		a.log.Info("the trainer finished its work (bye): nothing to checkpoint, nothing interrupted", zap.String("reason", reason))
		s.nothingToStop() // no stop to send, nothing to journal
		return
	}
	if a.trainers() == 0 {
		why := "no trainer connected"
		if w := a.boot.NoResumeWhy(); w != "" && a.src.Asks() {
			why = w // connected, but waiting on a restore (pkg/supervisor/internal/bootrestore)
		}
		a.log.Warn(why+": nothing to checkpoint before the deadline", zap.String("socket", a.cfg.Server.Path),
			zap.Int("connected", a.conns.Count()))
		a.stops.failed(s, why, now, a.stopEnds())
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
					if c := a.conns.Conn(cid); c != nil {
						c.Post(r.message())
					}
				}
			}
			return
		}
	}
	r := a.request(reason, reqDeadline, s)
	if r == nil {
		a.stops.failed(s, "checkpoint request not delivered", now, a.stopEnds())
		return
	}
	a.stops.requested(s, r, r.sent)
}

// stopSequence is the notices and signals this session got, and the stop
// sequence under way (current, nil: none).
type stopSequence struct {
	current     *stopState
	noticesSeen int
	lastNotice  *metadata.Notice
	signals     int       // SIGTERM/SIGINT received: 1 is a shutdown, 2 ends at once
	firstSignal time.Time // when the first of them came (SignalWindow)
	gaveUp      bool      // the uploads in flight were cancelled at the grace's end (giveUp)

	cfg *Config
}

// newStopSequence is a session's notices and signals before any. The loop
// tells it what happened (noticed, signalled, begin, tighten, withdraw,
// lateTrainer, committed, failed); what a stop's end touches of the
// session's other owners is handed to it then (stopEnds), never held.
func newStopSequence(cfg *Config) stopSequence { return stopSequence{cfg: cfg} }

// stopEnds is what a stop's end touches of the agent's other owners, as
// the loop hands it over at that moment: the trainers are told, the
// session's journal records it (and the cloud's event is acknowledged),
// the newest committed checkpoint and the source count what was lost.
type stopEnds struct {
	conns *trainers.Conns
	sess  *session.Session
	last  committedCheckpoint
	src   source.Source
}

// stopEnds is what a stop's end touches now (stop.go).
func (a *Agent) stopEnds() stopEnds {
	return stopEnds{conns: a.conns, sess: a.sess, last: a.commits.last, src: a.src}
}

// noticed: notice n came (a cloud's, a signal's, a fence's).
func (q *stopSequence) noticed(n metadata.Notice) {
	q.noticesSeen++
	q.lastNotice = &n
}

// signalled: a SIGTERM/SIGINT came at now. It returns how many signals
// count so far (1: a shutdown, 2 or more: stop at once), or 0 when this
// one came within window of the first and is the same signal (GNU
// timeout, `kill 0` and some init systems signal the agent and its group
// together).
func (q *stopSequence) signalled(now time.Time, window time.Duration) int {
	if q.signals == 1 && window > 0 && now.Sub(q.firstSignal) < window {
		return 0
	}
	q.signals++
	if q.signals == 1 {
		q.firstSignal = now
	}
	return q.signals
}

// begin: the stop s is under way (none was).
func (q *stopSequence) begin(s *stopState) { q.current = s }

// tighten: a notice with an earlier deadline came during the stop under
// way; true when it moved the deadline.
func (q *stopSequence) tighten(deadline time.Time) bool {
	s := q.current
	if s == nil || !deadline.Before(s.deadline) {
		return false
	}
	s.deadline = deadline
	return true
}

// withdraw: the cloud withdrew notice id. A stop it began that has not
// told the trainers yet ends as if it never began (its checkpoint, if
// asked for, becomes a periodic one); true when one did.
func (q *stopSequence) withdraw(id string) bool {
	s := q.current
	if s == nil || s.notice.ID != id || s.stopSent {
		return false
	}
	if s.req != nil {
		s.req.stop = nil
	}
	q.current = nil
	return true
}

// lateTrainer: trainer c connected during the stop: once the stop was
// sent, it is told at once.
func (q *stopSequence) lateTrainer(c *protocol.Conn) {
	if s := q.current; s != nil && s.stopSent {
		s.told = true
		c.Post(s.stopMessage())
	}
}

// newStop is the stop that notice n begins, for reason, ending at
// deadline, on the machine id, as the journal will record it.
func newStop(n metadata.Notice, reason string, deadline time.Time, id metadata.Identity) *stopState {
	s := &stopState{notice: n, reason: reason, deadline: deadline, record: journal.Interruption{
		Cloud: string(n.Cloud), Kind: string(n.Kind), Action: n.Action, NoticeID: n.ID,
		InstanceID: id.InstanceID, InstanceType: id.InstanceType, Zone: id.Zone,
		Notice: n.Detected.UTC(), Detected: n.Detected.UTC(),
	}}
	if !n.Deadline.IsZero() {
		d := n.Deadline.UTC()
		s.record.Deadline = &d
	}
	return s
}

// nothingToStop: the trainers finished their work (bye) before the stop:
// no stop to send, nothing interrupted, nothing to journal.
func (s *stopState) nothingToStop() { s.finished, s.stopSent = true, true }

// saved: the trainers saved the stop's checkpoint, of step, at now.
func (s *stopState) saved(step int64, now time.Time) {
	s.record.Done = &now
	s.record.Step = step
}

// joined starts the stop sequence for an interruption that reached
// another node: after the job's checkpoint commits, this node's ranks stop
// too, so that the whole job exits and its scheduler restarts it. It is
// not journalled: the node that got the notice records the interruption.
func (q *stopSequence) joined(m protocol.Message, reqDeadline, now time.Time, lastBytes int64) *stopState {
	upload := q.cfg.Scheduler.EstimateUpload(lastBytes)
	s := &stopState{
		notice:   metadata.Notice{Cloud: cloudJob, Kind: metadata.KindTermination, ID: "job-" + m.ID, Action: m.Reason, Detected: now},
		reason:   m.Reason,
		deadline: reqDeadline.Add(upload + q.cfg.Margin),
		joined:   true,
	}
	q.begin(s)
	return s
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
	joined   bool // the notice reached another node of the job (job.go)
	record   journal.Interruption
	recorded int64 // the step of the record as journalled (finish, committed)
}

// The stop as its checkpoint source sees it (source.Stop).
func (s *stopState) Reason() string          { return s.reason }
func (s *stopState) Notice() metadata.Notice { return s.notice }
func (s *stopState) Finished() bool          { return s.finished }

// Asked: the source asked the trainer for the stop's checkpoint at at.
func (s *stopState) Asked(at time.Time) {
	at = at.UTC()
	s.record.Requested = &at
}

// Checkpointed: the source's checkpoint for the stop is id, of step
// (source.Stop).
func (s *stopState) Checkpointed(id string, step int64, lostSeconds float64, done time.Time) {
	s.record.CheckpointID, s.record.Step, s.record.LostSeconds = id, step, lostSeconds
	if !done.IsZero() {
		s.record.Done = &done
	}
}

func (s *stopState) stopMessage() protocol.Message {
	dl := s.deadline.UTC()
	return protocol.Message{Type: protocol.TypeStop, Reason: s.reason, Deadline: &dl}
}

// exitWait is the longest the exit waits for the writes that outlive the
// loop (journal, acknowledgement, the session's end), counted from the
// loop's end; what is still in flight then is cancelled, so nothing queues
// behind it past the bound. Not clamped to the stop's deadline: a store
// that comes back a moment after a failed interruption checkpoint still
// gets the journal's record of that failure (TestStoreFault_DownDuringInterruption).
const exitWait = 10 * time.Second

// exitBy is when the exit stops waiting (exitWait from now).
func (q *stopSequence) exitBy(now time.Time) time.Time {
	return now.Add(exitWait)
}

// tick enforces the interruption's deadlines: past the notice deadline
// the child gets SIGTERM (SIGKILL after KillAfter).
// The trainer is stopped by the loop (stopAtDeadline) when tick reports
// the deadline passed.
func (q *stopSequence) tick(now time.Time, e stopEnds) (deadlinePassed bool) {
	s := q.current
	if s == nil || now.Before(s.deadline) {
		return false
	}
	if !s.finished {
		q.failed(s, "deadline passed", now, e)
	}
	return true
}

// graceOver: a signal's stop is under way and its deadline (--term-grace,
// or a notice's sooner one) has passed. Nothing is waited for past it:
// not a periodic upload, not a job commit waiting for a silent node's
// part (a SIGTERM once ended the agent 9 min 57 s later, when such a
// commit reached its own bound; issue 46).
func (q *stopSequence) graceOver(now time.Time) bool {
	return q.signals > 0 && q.current != nil && !now.Before(q.current.deadline)
}

// giveUp cancels the uploads still in flight once the grace is over: the
// previous committed checkpoint stands (their results, if they come
// before the loop ends, report them as not committed).
func (q *stopSequence) giveUp(uploads map[string]*upload) {
	if q.gaveUp || len(uploads) == 0 {
		return
	}
	q.gaveUp = true
	ids := make([]string, 0, len(uploads))
	for id, u := range uploads {
		u.cancel()
		ids = append(ids, id)
	}
	q.cfg.Log.Warn("stop deadline passed: giving up the uploads in flight (the previous committed checkpoint stands)",
		zap.Strings("ids", ids), zap.Time("deadline", q.current.deadline))
}

func (s *stopState) send(t *trainers.Conns) {
	if s.stopSent {
		return
	}
	s.stopSent = true
	s.told = t.Count() > 0
	t.Broadcast(s.stopMessage())
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
func (s *stopState) recordLostSteps(src source.Source, committed int64, now time.Time) {
	v := src.View(now)
	s.record.LostSteps, s.record.LostStepsFrom = max(v.Reached-committed, 0), v.ReachedFrom
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
func (q *stopSequence) committed(s *stopState, res *commit.Result, now time.Time, e stopEnds) {
	t := now.UTC()
	if s.finished && s.record.CommitOK {
		// A newer checkpoint of the trainer's committed after the stop's
		// (zero-code mode: one that was complete just before the stop, seen
		// only after it): the record names it, nothing else is said again.
		// (A stop that failed and whose checkpoint commits late goes on
		// below: its record becomes a committed one.)
		if res.Manifest.Step <= s.recorded || s.joined {
			return
		}
		s.record.CheckpointID, s.record.Step, s.recorded = res.Manifest.ID, res.Manifest.Step, res.Manifest.Step
		s.record.Committed, s.record.Bytes = &t, res.Bytes
		s.recordLostSteps(e.src, res.Manifest.Step, now)
		q.cfg.Log.Info("a newer checkpoint committed after the interruption's: its record names it", zap.Int64("step", res.Manifest.Step))
		e.sess.JournalAsync(recordInterruption(s.record))
		return
	}
	s.record.Committed, s.record.CommitOK, s.record.Bytes = &t, true, res.Bytes
	s.recordLostSteps(e.src, res.Manifest.Step, now)
	s.noticeOutcome(q.cfg.Metrics, true, now)
	q.cfg.Log.Info("interruption checkpoint committed: stopping the trainer", zap.Int64("step", res.Manifest.Step),
		zap.Duration("notice_to_commit", now.Sub(s.notice.Detected).Round(time.Millisecond)), zap.Time("deadline", s.deadline))
	q.finish(s, e)
	if acker, ok := q.cfg.Source.(metadata.Acker); ok && s.notice.Cloud == q.cfg.Source.Cloud() {
		id := s.notice.ID
		e.sess.GoAck(func(landing context.Context) {
			// Outlives the loop, up to the notice's deadline (session.AwaitLanding).
			ctx, cancel := context.WithDeadline(landing, s.deadline)
			defer cancel()
			if err := acker.Ack(ctx, id); err != nil {
				q.cfg.Log.Warn("could not acknowledge the event", zap.String("id", id), zap.Error(err))
				return
			}
			q.cfg.Log.Info("event acknowledged", zap.String("id", id))
		})
	}
}

// NothingCommitted is what the log and the journal say when a stop's
// checkpoint failed and the run has none committed.
const NothingCommitted = "nothing was ever committed: a rerun starts from the beginning"

// failed: no new checkpoint will commit before the deadline. The
// previous committed checkpoint stands (when there is one); the work
// since then is lost.
func (q *stopSequence) failed(s *stopState, why string, now time.Time, e stopEnds) {
	if s.finished {
		return
	}
	s.record.Error = why
	base := e.last.trainedAt
	if base.IsZero() {
		base = e.sess.Started()
	}
	s.record.LostSeconds = now.Sub(base).Seconds()
	s.recordLostSteps(e.src, e.last.step, now)
	s.noticeOutcome(q.cfg.Metrics, false, now)
	if e.last.id == "" {
		// Nothing to stand: the journal, the log and the exit code's
		// meaning (docs/protocol.md "Exit codes") say so.
		s.record.Error = why + "; " + NothingCommitted
		q.cfg.Log.Warn("interruption checkpoint did not commit: "+NothingCommitted,
			zap.String("why", why), zap.Bool("ever_committed", false), zap.Int64("lost_steps", s.record.LostSteps),
			zap.Float64("lost_seconds", s.record.LostSeconds))
		q.finish(s, e)
		return
	}
	q.cfg.Log.Warn("interruption checkpoint did not commit: the previous checkpoint stands",
		zap.String("why", why), zap.Int64("committed_step", e.last.step), zap.Int64("lost_steps", s.record.LostSteps),
		zap.Float64("lost_seconds", s.record.LostSeconds))
	q.finish(s, e)
}

func (q *stopSequence) finish(s *stopState, e stopEnds) {
	s.finished = true
	s.send(e.conns)
	if s.joined {
		return // the node that got the notice journals it
	}
	s.recorded = s.record.Step
	e.sess.JournalAsync(recordInterruption(s.record))
}

// recordInterruption is the journal write of an interruption's record. A
// stop may write it twice (its end, then a newer checkpoint's amendment),
// and the writes land in any order, or one not at all: whichever makes
// it a committed record counts the commit, once.
func recordInterruption(rec journal.Interruption) func(*journal.Journal) {
	return func(j *journal.Journal) {
		if j.RecordInterruption(rec) {
			j.Stats.NoticeCommits++
		}
	}
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
// (pkg/supervisor/internal/ranks).
func (q *stopSequence) exitCodeFor(e childproc.Exit, d *localDirs, w *ranks.Tracker) int {
	code, s := e.Code, q.current
	if s == nil {
		return w.PeerLossExit(code) // pkg/supervisor/internal/ranks: 75 when the ranks lost a peer
	}
	if s.reason != protocol.ReasonInterruption && s.reason != protocol.ReasonShutdown {
		return code
	}
	// In --signal mode the stop's checkpoint signal is the trainer's only
	// word of the stop (frameworks exit after a save on signal): told.
	told := s.told || (q.cfg.Signal != 0 && s.req != nil)
	if code == 0 && !told && !e.DeadlineKill && !e.Stopping {
		// Nothing told it to stop (it said bye, or ended on its own before
		// the stop reached it): it finished its work. Run again, it would
		// repeat a completed job.
		q.cfg.Log.Info("trainer exited 0 before anything told it to stop: it finished; exiting 0", zap.String("reason", s.reason))
		return 0
	}
	switch {
	case code == 0, code == ExitInterrupted:
		return ExitInterrupted
	case e.DeadlineKill && q.signals < 2 && (code == 128+int(syscall.SIGTERM) || code == 128+int(syscall.SIGKILL) || code == 1):
		// torchrun answers the group's SIGTERM with 1, never 143.
		return ExitInterrupted
	case code == 1 && s.stopSent && !s.record.CommitOK && d.childSaid75():
		// The checkpoint did not commit (the previous one stands), the
		// ranks were stopped and said 75: a single trainer would exit 75.
		q.cfg.Log.Info("trainer exited 1 after its ranks were stopped and wrote 75 to " + localdirs.ExitFileEnv + ": exiting 75")
		return ExitInterrupted
	case code == 1 && s.record.CommitOK && s.stopSent:
		// torchrun reports workers that exited 75 as its own exit 1
		// (docs/distributed.md has the measurements); the checkpoint is
		// committed and every rank was told to stop: run me again.
		q.cfg.Log.Info("trainer exited 1 after the checkpoint committed and its ranks were stopped (torchrun reports its workers' 75 as 1): exiting 75")
		return ExitInterrupted
	case code == 1 && w.Part():
		return w.StopLauncherExit(code) // pkg/supervisor/internal/ranks (#37 item 4)
	}
	return code
}

package supervisor

import (
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/metadata"
	"github.com/spotagent/spotagent/pkg/protocol"
	"github.com/spotagent/spotagent/pkg/supervisor/bootrestore"
	"github.com/spotagent/spotagent/pkg/supervisor/trainers"
)

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
		sendStatus(a.conns, c, a.status())
	case protocol.TypeBye:
		a.commits.seeStep(m.Step)
		a.conns.Bye(c.ID()) // pkg/supervisor/trainers
	case protocol.TypeDisconnected:
		a.boot.Forget(c.ID())                                                                                        // pkg/supervisor/bootrestore
		a.ranks.ConnEnded(c, a.conns.SaidBye(c.ID()), a.stops.current != nil, a.proc.Running(), a.dirs.ExitFileSays) // pkg/supervisor/ranks
		a.conns.Disconnected(c.ID())                                                                                 // pkg/supervisor/trainers
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
	a.boot.RejoinHello(a.commits.committed(), a.conns.Count(), len(a.commits.uploads)) // pkg/supervisor/bootrestore
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
	// One line: connected, or connected but left out (pkg/supervisor/trainers:
	// the child's own connections go first).
	if why := a.conns.Welcomed(c); why != "" {
		a.log.Warn(trainers.LeftOutMsg, append(fields, zap.String("why", why))...)
	} else {
		a.log.Info("trainer connected", fields...)
	}
	a.job.hello(m, a.log)                                                    // job_policy.go
	a.ranks.Hello(m, a.proc.Running())                                       // pkg/supervisor/ranks
	a.live.Start(m, heartbeatEnv(&a.cfg), a.job.part(), a.sess.ID(), a.life) // pkg/supervisor/ranks
	// A trainer that connects during an interruption is told at once.
	a.stops.lateTrainer(c)
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
		if n.Cloud != metadata.CloudSignal && a.abortStart("interruption notice", &bootrestore.Abort{Notice: true}) { // agent_restore.go
			return
		}
		reason := protocol.ReasonInterruption
		if n.Cloud == metadata.CloudSignal {
			reason = protocol.ReasonShutdown
		}
		backingOff := !a.proc.RestartAt().IsZero()
		if a.boot.CancelRestart(reason) || backingOff { // pkg/supervisor/bootrestore: its partial directory goes
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
		a.log.Warn("no trainer connected: nothing to checkpoint before the deadline", zap.String("socket", a.cfg.Server.Path))
		a.stops.failed(s, "no trainer connected", now, a.stopEnds())
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

package supervisor

import (
	"time"

	"go.uber.org/zap"
)

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
	fix := "the trainer must call spotagent.connect() with SPOTAGENT_SOCKET in its environment (spotagent run sets it; env -u, sudo or a wrapper that clears the environment drops it)"
	if v.sidecar {
		fix = "set SPOTAGENT_SOCKET=" + v.socket + " in the trainer container and mount the volume that holds the socket (the sidecar's shared emptyDir), then call spotagent.connect()"
	}
	fields := []zap.Field{zap.String("socket", v.socket), zap.String("fix", fix),
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

// nextWake is when the next warning could be due (zero: none is pending).
func (s *silence) nextWake(reqs map[string]*request, after time.Duration) time.Time {
	var wake time.Time
	earlier := func(t time.Time) {
		if wake.IsZero() || t.Before(wake) {
			wake = t
		}
	}
	if !s.noTrainerSaid.IsZero() {
		earlier(s.noTrainerSaid.Add(warnEvery))
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
	if a.boot.Busy() || a.boot.Failed() || a.boot.Aborted() { // a restore runs (pkg/supervisor/bootrestore)
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

func (a *Agent) unansweredAfter() time.Duration {
	return UnansweredAfter(a.cfg.Scheduler.Interval(), a.commits.saveTook)
}

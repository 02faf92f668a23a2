package session

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/fleet"
	"github.com/spotagent/spotagent/pkg/metadata"
)

// session is this session of the run and the run's journal, which
// records it: when it started, its id, the run time of the sessions
// before it, and the journal writes and cloud acknowledgements in flight
// (they outlive the loop: awaitLanding).
type session struct {
	started   time.Time // this session
	id        string    // its id in the journal (Session.ID)
	ranBefore float64   // run time of earlier sessions, seconds (journal)
	journal   *journal.Writer
	journals  sync.WaitGroup // journal updates in flight
	acks      sync.WaitGroup // cloud event acknowledgements in flight

	life    context.Context // the agent's: journal writes outlive it (WithoutCancel)
	log     *zap.Logger
	metrics Metrics

	landOnce sync.Once
	landing  context.Context    // outlives life; cancelled when the exit stops waiting (awaitLanding)
	abandon  context.CancelFunc // cancels landing
}

// landingCtx is the context of the writes that outlive the loop: not
// ended by life, but by the exit once it stops waiting for them, so that
// an abandoned write (a store lock held elsewhere) gives the journal back
// at once instead of holding it until its own timeout.
func (s *session) landingCtx() context.Context {
	s.landOnce.Do(func() { s.landing, s.abandon = context.WithCancel(context.WithoutCancel(s.life)) })
	return s.landing
}

// journalAsync applies fn to the journal and saves it in the background.
func (s *session) journalAsync(fn func(*journal.Journal)) {
	s.journals.Add(1)
	go func() {
		defer s.journals.Done()
		// Outlives the loop: the interruption's record and the session's
		// stats must land after it ends (awaitLanding).
		ctx, cancel := context.WithTimeout(s.landingCtx(), time.Minute)
		defer cancel()
		var g *journal.Goodput
		err := s.journal.Update(ctx, func(j *journal.Journal) {
			fn(j)
			g, _ = journal.Account(j, time.Now()) // the journal as written
		})
		switch {
		case err == nil && g != nil:
			s.metrics.Goodput(g)
		case err != nil:
			// Cancelled only by the exit that stopped waiting for it
			// (awaitLanding): its error says what held it.
			s.log.Warn("could not write the run journal", zap.Error(err))
			s.metrics.Error("journal")
		}
	}()
}

// recordSession adds this session to the journal, once the restore worked:
// a start that fails there leaves no trace in the store.
func (s *session) recordSession(id metadata.Identity) {
	s.journalAsync(func(j *journal.Journal) {
		j.Sessions = append(j.Sessions, journal.Session{ID: s.id, Start: s.started.UTC(), Instance: machineOf(id)})
	})
}

// runSeconds is the run's time on machines, this session included; the
// journal keeps it current at every commit, so a crash loses little of it.
func (s *session) runSeconds() float64 { return s.ranBefore + time.Since(s.started).Seconds() }

// awaitLanding waits, until by at most, for the acknowledgements and
// journal writes in flight: created on landingCtx, they outlive the loop.
// Past by they are abandoned: their context is cancelled (a write waiting
// on a held store lock returns at once) and they get at most a second
// more to return, so that the journal is free for the session's end.
func (s *session) awaitLanding(by time.Time) {
	landed := make(chan struct{})
	go func() { s.acks.Wait(); s.journals.Wait(); close(landed) }()
	select {
	case <-landed:
		return
	default:
	}
	start := time.Now()
	wait := max(time.Until(by), 0)
	s.log.Info("exit: waiting for the journal writes and event acknowledgements in flight", zap.Duration("at_most", wait.Round(time.Millisecond)))
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-landed:
		return
	case <-t.C:
	}
	s.landingCtx()
	s.abandon()
	s.log.Warn("exit: a journal write or event acknowledgement still in flight: abandoned",
		zap.Duration("waited", time.Since(start).Round(time.Millisecond)))
	select {
	case <-landed:
	case <-time.After(time.Second):
	}
}

// exitWrite is the context of the session's last journal write and fleet
// record, bounded by by but given at least a second: the record of how
// the session ended is worth a second past a deadline already spent.
func (s *session) exitWrite(by time.Time) (context.Context, context.CancelFunc) {
	return context.WithDeadline(context.WithoutCancel(s.life), later(by, time.Now().Add(time.Second)))
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// recordFleet refreshes this run's entry in the fleet summary from the
// journal as the session leaves it; a failure costs only the summary
// (spotagent fleet --recount rebuilds it). A session the journal never
// recorded (the trainer exited before the restore ended) records nothing.
func (s *session) recordFleet(ctx context.Context, cfg *Config, step int64, fenced bool) {
	if cfg.Fleet == nil || fenced {
		return
	}
	if ctx.Err() != nil {
		s.log.Warn("fleet record not written: the exit's deadline passed (spotagent fleet --recount rebuilds it)")
		return
	}
	j := s.journal.Snapshot()
	if j.SessionByID(s.id) == nil {
		s.log.Debug("no fleet record: the journal has no record of this session (it ended before its restore)")
		return
	}
	if err := fleet.RecordSessionOf(ctx, cfg.Fleet, cfg.FleetDir, j, step, s.id); err != nil {
		s.log.Warn("could not write the fleet record", zap.Error(err))
	}
}

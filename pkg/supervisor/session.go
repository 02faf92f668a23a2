package supervisor

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint"
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
	journal   *checkpoint.JournalWriter
	journals  sync.WaitGroup // journal updates in flight
	acks      sync.WaitGroup // cloud event acknowledgements in flight

	life    context.Context // the agent's: journal writes outlive it (WithoutCancel)
	log     *zap.Logger
	metrics Metrics
}

// journalAsync applies fn to the journal and saves it in the background.
func (s *session) journalAsync(fn func(*checkpoint.Journal)) {
	s.journals.Add(1)
	go func() {
		defer s.journals.Done()
		// Outlives the loop: the interruption's record and the session's
		// stats must land after it ends (awaitLanding).
		ctx, cancel := context.WithTimeout(context.WithoutCancel(s.life), time.Minute)
		defer cancel()
		var g *checkpoint.Goodput
		err := s.journal.Update(ctx, func(j *checkpoint.Journal) {
			fn(j)
			g, _ = checkpoint.Account(j, time.Now()) // the journal as written
		})
		switch {
		case err == nil && g != nil:
			s.metrics.Goodput(g)
		case err != nil && !errors.Is(err, context.Canceled):
			s.log.Warn("could not write the run journal", zap.Error(err))
			s.metrics.Error("journal")
		}
	}()
}

// recordSession adds this session to the journal, once the restore worked:
// a start that fails there leaves no trace in the store.
func (s *session) recordSession(id metadata.Identity) {
	s.journalAsync(func(j *checkpoint.Journal) {
		j.Sessions = append(j.Sessions, checkpoint.Session{ID: s.id, Start: s.started.UTC(), Instance: machineOf(id)})
	})
}

// runSeconds is the run's time on machines, this session included; the
// journal keeps it current at every commit, so a crash loses little of it.
func (s *session) runSeconds() float64 { return s.ranBefore + time.Since(s.started).Seconds() }

// awaitLanding waits, at most 10s, for the acknowledgements and journal
// writes in flight: created with context.WithoutCancel, they outlive the
// loop, and each has a deadline of its own. Past 10s they are abandoned.
func (s *session) awaitLanding() {
	landed := make(chan struct{})
	go func() { s.acks.Wait(); s.journals.Wait(); close(landed) }()
	select {
	case <-landed:
	case <-time.After(10 * time.Second):
		s.log.Warn("event acknowledgement or journal update still in flight at exit: abandoned")
	}
}

// recordFleet refreshes this run's entry in the fleet summary from the
// journal as the session leaves it; a failure costs only the summary
// (spotagent fleet --recount rebuilds it). A session the journal never
// recorded (the trainer exited before the restore ended) records nothing.
func (s *session) recordFleet(ctx context.Context, cfg *Config, step int64, fenced bool) {
	if cfg.Fleet == nil || fenced {
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

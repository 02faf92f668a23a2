// Package session is this session of a run as the agent records it: the
// run's journal and its writes in flight, which outlive the agent's loop,
// the session's end in the journal and in the fleet summary.
package session

// This session and the run's journal (Session): journal writes and
// acknowledgements in flight, the fleet record at its end; the identity
// written to the store (MachineOf).

import (
	"context"
	"errors"
	"math"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/internal/retry"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/cloud/wrap"
	"github.com/spotagent/spotagent/pkg/fleet"
	"github.com/spotagent/spotagent/pkg/metadata"
)

// Session is this session of the run and the run's journal, which
// records it: when it started, its id, the run time of the sessions
// before it, and the journal writes and cloud acknowledgements in flight
// (they outlive the loop: AwaitLanding). The agent tells it what
// happened (JournalRead, RecordSession, GoAck) and asks it.
type Session struct {
	started   time.Time // this session
	id        string    // its id in the journal (journal.Session.ID)
	ranBefore float64   // run time of earlier sessions, seconds (journal)
	journal   *journal.Writer
	retry     retry.Policy   // how a journal write that failed is made again (journalRetry)
	journals  sync.WaitGroup // journal updates in flight
	acks      sync.WaitGroup // cloud event acknowledgements in flight

	life    context.Context // the agent's: journal writes outlive it (WithoutCancel)
	log     *zap.Logger
	metrics Metrics

	landOnce sync.Once
	landing  context.Context    // outlives life; cancelled when the exit stops waiting (AwaitLanding)
	abandon  context.CancelFunc // cancels landing
}

// Metrics is what a session reports: the goodput after each journal
// write, and a write that failed.
type Metrics interface {
	Goodput(g *journal.Goodput)
	Error(component string)
}

// New is a session started now with the fresh id id; life is the agent's
// (journal writes outlive it).
func New(id string, life context.Context, log *zap.Logger, m Metrics) *Session {
	return &Session{started: time.Now(), id: id, life: life, log: log, metrics: m}
}

// ID is this session's id in the journal (journal.Session.ID).
func (s *Session) ID() string { return s.id }

// Started is when this session started.
func (s *Session) Started() time.Time { return s.started }

// JournalRead: the run's journal as the start read it (j). This session's
// writes go to st through a writer of it (Journal), and the sessions
// before this one ran j.Stats.RunSeconds (RunSeconds).
func (s *Session) JournalRead(st cloud.Store, j *journal.Journal) {
	s.journal = journal.NewWriter(st, j)
	s.retry = journalRetry(st)
	s.ranBefore = j.Stats.RunSeconds
}

// Journal is the writer of the run's journal (nil before JournalRead).
func (s *Session) Journal() *journal.Writer { return s.journal }

// GoAck runs ack, a cloud event's acknowledgement, beside the loop on
// LandingCtx: it outlives the loop, and AwaitLanding waits for it.
func (s *Session) GoAck(ack func(landing context.Context)) {
	s.acks.Add(1)
	go func() {
		defer s.acks.Done()
		ack(s.LandingCtx())
	}()
}

// LandingCtx is the context of the writes that outlive the loop: not
// ended by life, but by the exit once it stops waiting for them, so that
// an abandoned write (a store lock held elsewhere) gives the journal back
// at once instead of holding it until its own timeout.
func (s *Session) LandingCtx() context.Context {
	s.landOnce.Do(func() { s.landing, s.abandon = context.WithCancel(context.WithoutCancel(s.life)) })
	return s.landing
}

// JournalAsync applies fn to the journal and saves it in the background.
func (s *Session) JournalAsync(fn func(*journal.Journal)) {
	s.journals.Add(1)
	go func() {
		defer s.journals.Done()
		// Outlives the loop: the interruption's record and the session's
		// stats must land after it ends (AwaitLanding).
		// Retried at least every journalRetryMax while the store is down, so
		// that a write in flight lands soon after it is back, before the
		// exit stops waiting (TestStoreFault_DownDuringInterruption).
		ctx, cancel := context.WithTimeout(cloud.WithMaxWait(s.LandingCtx(), journalRetryMax), time.Minute)
		defer cancel()
		var g *journal.Goodput
		// The whole write again while the store fails, not only its
		// requests: an outage longer than a request's attempts (some 14 s
		// of them at journalRetryMax) would otherwise drop the record,
		// even when the store is back before the exit stops waiting. The
		// write keeps the journal's turn meanwhile: the writes land in
		// order, each once (journal.Writer.UpdateRetrying).
		err := s.journal.UpdateRetrying(ctx, s.retry, func(j *journal.Journal) {
			fn(j)
			g, _ = journal.Account(j, time.Now()) // the journal as written
		})
		switch {
		case err == nil && g != nil:
			s.metrics.Goodput(g)
		case err != nil:
			// Cancelled only by the exit that stopped waiting for it
			// (AwaitLanding): its error says what held it.
			s.log.Warn("could not write the run journal", zap.Error(err))
			s.metrics.Error("journal")
		}
	}()
}

// journalRetryMax bounds the wait between a journal write's retries: the
// store's own longest wait (20 s) could outlast the exit's 10 s wait for a
// write in flight after the store came back.
const journalRetryMax = 2 * time.Second

// journalRetry retries a journal write to st that failed until its
// context ends (JournalAsync's: a minute, or the exit that stops waiting),
// but not one that can never land: a fenced session's, one the store
// refuses for good (wrap.Permanent), or one its backend's own
// classification gives up on (a 400, a 501: the Retryable of the store's
// retry layer, pkg/cloud/wrap), which would otherwise be asked again every
// 2 s for a minute and hold the exit its whole wait.
func journalRetry(st cloud.Store) retry.Policy {
	storeRetries := func(error) bool { return true }
	if r, ok := st.(interface{ Retryable(error) bool }); ok {
		storeRetries = r.Retryable
	}
	return retry.Policy{
		Attempts: math.MaxInt,
		Backoff:  retry.Backoff{Min: 250 * time.Millisecond, Max: journalRetryMax},
		Retryable: func(err error) bool {
			return !errors.Is(err, checkpoint.ErrFenced) && !wrap.Permanent(err) && storeRetries(err)
		},
	}
}

// RecordSession adds this session to the journal, once the restore worked:
// a start that fails there leaves no trace in the store.
func (s *Session) RecordSession(id metadata.Identity) {
	s.JournalAsync(func(j *journal.Journal) {
		j.Sessions = append(j.Sessions, journal.Session{ID: s.id, Start: s.started.UTC(), Instance: MachineOf(id)})
	})
}

// RunSeconds is the run's time on machines, this session included; the
// Journal keeps it current at every commit, so a crash loses little of it.
func (s *Session) RunSeconds() float64 { return s.ranBefore + time.Since(s.started).Seconds() }

// AwaitLanding waits, until by at most, for the acknowledgements and
// Journal writes in flight: created on LandingCtx, they outlive the loop.
// Past by they are abandoned: their context is cancelled (a write waiting
// on a held store lock returns at once) and they get at most a second
// more to return, so that the journal is free for the session's end.
func (s *Session) AwaitLanding(by time.Time) {
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
	s.LandingCtx()
	s.abandon()
	s.log.Warn("exit: a journal write or event acknowledgement still in flight: abandoned",
		zap.Duration("waited", time.Since(start).Round(time.Millisecond)))
	select {
	case <-landed:
	case <-time.After(time.Second):
	}
}

// ExitWrite is the context of the session's last journal write and fleet
// record, bounded by by but given at least a second: the record of how
// the session ended is worth a second past a deadline already spent.
func (s *Session) ExitWrite(by time.Time) (context.Context, context.CancelFunc) {
	return context.WithDeadline(context.WithoutCancel(s.life), later(by, time.Now().Add(time.Second)))
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// RecordFleet refreshes this run's entry in the fleet summary (fleetStore,
// the run's directory fleetDir) from the
// Journal as the session leaves it; a failure costs only the summary
// (spotagent fleet --recount rebuilds it). A session the journal never
// recorded (the trainer exited before the restore ended) records nothing.
func (s *Session) RecordFleet(ctx context.Context, fleetStore cloud.Store, fleetDir string, step int64, fenced bool) {
	if fleetStore == nil || fenced {
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
	if err := fleet.RecordSessionOf(ctx, fleetStore, fleetDir, j, step, s.id); err != nil {
		s.log.Warn("could not write the fleet record", zap.Error(err))
	}
}

// MachineOf converts the metadata package's identity into the schema the
// manifest, journal and lease own (checkpoint.Machine): the boundary
// between what the cloud says and what is written to the store.
func MachineOf(id metadata.Identity) checkpoint.Machine {
	return checkpoint.Machine{Cloud: string(id.Cloud), InstanceID: id.InstanceID, InstanceType: id.InstanceType,
		Zone: id.Zone, Lifecycle: id.Lifecycle, Name: id.Name}
}

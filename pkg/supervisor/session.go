package supervisor

import (
	"sync"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"
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
}

package checkpoint

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/metadata"
)

// JournalFormat names the journal schema.
const JournalFormat = "spotagent.journal/v1"

// Journal is the run's memory across machines: what interrupted it, what
// each interruption cost, what each restart restored, and the measurements
// the scheduler starts from. It lives at journal.json in the store.
type Journal struct {
	Format        string         `json:"format"`
	RunID         string         `json:"run_id"`
	Sessions      []Session      `json:"sessions"`
	Interruptions []Interruption `json:"interruptions"`
	Restores      []RestoreEntry `json:"restores"`
	Stats         Stats          `json:"stats"`
}

// Session is one agent run on one machine.
type Session struct {
	Start    time.Time         `json:"start"`
	End      *time.Time        `json:"end,omitempty"`
	Instance metadata.Identity `json:"instance"`
	ExitCode *int              `json:"exit_code,omitempty"`
}

// Interruption records one notice that ended (or would have ended) a session.
type Interruption struct {
	Cloud        metadata.Cloud `json:"cloud"`
	Kind         metadata.Kind  `json:"kind"`
	Action       string         `json:"action,omitempty"`
	NoticeID     string         `json:"notice_id,omitempty"`
	InstanceID   string         `json:"instance_id,omitempty"`
	InstanceType string         `json:"instance_type,omitempty"`
	Zone         string         `json:"zone,omitempty"`
	Notice       time.Time      `json:"notice"`   // when the cloud raised it, as far as known
	Detected     time.Time      `json:"detected"` // when this agent saw it
	Deadline     *time.Time     `json:"deadline,omitempty"`
	Requested    *time.Time     `json:"requested,omitempty"` // checkpoint message sent
	Done         *time.Time     `json:"done,omitempty"`      // trainer finished saving
	Committed    *time.Time     `json:"committed,omitempty"` // latest.json written
	CheckpointID string         `json:"checkpoint_id,omitempty"`
	Step         int64          `json:"step,omitempty"`
	Bytes        int64          `json:"bytes,omitempty"`
	CommitOK     bool           `json:"commit_ok"`
	Error        string         `json:"error,omitempty"`
	// LostSeconds is the training time since the newest committed
	// checkpoint that this interruption threw away; LostSteps the same in
	// steps, when the trainer reported progress.
	LostSeconds float64 `json:"lost_seconds"`
	LostSteps   int64   `json:"lost_steps,omitempty"`
}

// RestoreEntry records one restore at start.
type RestoreEntry struct {
	At           time.Time `json:"at"`
	CheckpointID string    `json:"checkpoint_id"`
	Step         int64     `json:"step"`
	Manifest     string    `json:"manifest"`
	Bytes        int64     `json:"bytes"`
	Seconds      float64   `json:"seconds"`
	Skipped      []string  `json:"skipped,omitempty"`
}

// Stats are the running measurements a restarted run starts from.
type Stats struct {
	Checkpoints   int     `json:"checkpoints"`    // committed
	Failures      int     `json:"failures"`       // checkpoints that did not commit
	CostSeconds   float64 `json:"cost_seconds"`   // EWMA of request → done
	BytesPerSec   float64 `json:"bytes_per_sec"`  // upload throughput estimate
	LastBytes     int64   `json:"last_bytes"`     // size of the newest checkpoint
	RunSeconds    float64 `json:"run_seconds"`    // training time over all sessions
	NoticeCommits int     `json:"notice_commits"` // interruptions whose checkpoint committed
}

// maxJournal bounds what is read as a journal.
const maxJournal = 16 << 20

// ReadJournal loads the journal; a missing one is an empty journal.
func ReadJournal(ctx context.Context, st cloud.Store, runID string) (*Journal, error) {
	j := &Journal{Format: JournalFormat, RunID: runID}
	err := readJSON(ctx, st, JournalKey, maxJournal, j)
	if err != nil && !errors.Is(err, cloud.ErrNotExist) {
		return nil, fmt.Errorf("journal: %w", err)
	}
	return j, nil
}

// JournalWriter serialises changes to a journal and saves it.
type JournalWriter struct {
	st cloud.Store
	mu sync.Mutex
	j  *Journal
}

// NewJournalWriter wraps a journal read with ReadJournal.
func NewJournalWriter(st cloud.Store, j *Journal) *JournalWriter {
	return &JournalWriter{st: st, j: j}
}

// Update applies fn to the journal under the lock and saves the result.
func (w *JournalWriter) Update(ctx context.Context, fn func(*Journal)) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	fn(w.j)
	body, err := json.MarshalIndent(w.j, "", "  ")
	if err != nil {
		return err
	}
	if err := w.st.Put(ctx, JournalKey, bytes.NewReader(body), int64(len(body)), cloud.PutOptions{}); err != nil {
		return fmt.Errorf("write journal: %w", err)
	}
	return nil
}

// Snapshot returns a deep copy of the journal.
func (w *JournalWriter) Snapshot() *Journal {
	w.mu.Lock()
	defer w.mu.Unlock()
	b, _ := json.Marshal(w.j)
	var c Journal
	_ = json.Unmarshal(b, &c)
	return &c
}

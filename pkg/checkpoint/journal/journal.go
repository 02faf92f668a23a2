// Package journal keeps the run's memory across machines (journal.json):
// its sessions, interruptions and restores, and the measurements a
// restarted run's scheduler starts from; Writer updates it by
// compare-and-swap, fenced by the session's lease. Account turns it into
// goodput.
package journal

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// Format names the journal schema.
const Format = "spotagent.journal/v1"

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
	// ID names the session among those of a job's agents, which share one
	// journal and append theirs concurrently: find it with SessionByID,
	// never as the last one. Empty in journals of older agents.
	ID       string             `json:"id,omitempty"`
	Start    time.Time          `json:"start"`
	End      *time.Time         `json:"end,omitempty"`
	Instance checkpoint.Machine `json:"instance"`
	ExitCode *int               `json:"exit_code,omitempty"`
	// BlockedSeconds is the time the trainer spent blocked in checkpoints
	// (request → done) in this session; nil in journals of older agents.
	BlockedSeconds *float64 `json:"blocked_seconds,omitempty"`
	// UnprotectedSeconds is the time the session's trainer ran with no
	// trainer connected to checkpoint it, once a checkpoint was due
	// (counted from the last commit, or the session's start): not goodput.
	UnprotectedSeconds *float64 `json:"unprotected_seconds,omitempty"`
	// Finished: the session's trainer finished its work (it exited 0
	// before anything told it to stop, or said bye); LastStep is the
	// newest step it reported (nil when it reported none). A finished
	// run's next start says so (FinishedBefore).
	Finished bool   `json:"finished,omitempty"`
	LastStep *int64 `json:"last_step,omitempty"`
}

// Interruption records one notice that ended (or would have ended) a session.
type Interruption struct {
	Cloud        string     `json:"cloud"` // metadata.Cloud
	Kind         string     `json:"kind"`  // metadata.Kind
	Action       string     `json:"action,omitempty"`
	NoticeID     string     `json:"notice_id,omitempty"`
	InstanceID   string     `json:"instance_id,omitempty"`
	InstanceType string     `json:"instance_type,omitempty"`
	Zone         string     `json:"zone,omitempty"`
	Notice       time.Time  `json:"notice"`   // when the cloud raised it, as far as known
	Detected     time.Time  `json:"detected"` // when this agent saw it
	Deadline     *time.Time `json:"deadline,omitempty"`
	Requested    *time.Time `json:"requested,omitempty"` // checkpoint message sent
	Done         *time.Time `json:"done,omitempty"`      // trainer finished saving
	Committed    *time.Time `json:"committed,omitempty"` // latest.json written
	CheckpointID string     `json:"checkpoint_id,omitempty"`
	Step         int64      `json:"step,omitempty"`
	Bytes        int64      `json:"bytes,omitempty"`
	CommitOK     bool       `json:"commit_ok"`
	Error        string     `json:"error,omitempty"`
	Loss                    // its fields inline in the JSON, last
}

// Loss is what an interruption threw away. LostSeconds is the training
// time since the newest committed checkpoint; LostSteps the same in
// steps, counted as LostStepsFrom says: empty when from the trainer's own
// reports (protocol mode), else LostFromEstimate or LostFromDir.
type Loss struct {
	LostSeconds   float64 `json:"lost_seconds"`
	LostSteps     int64   `json:"lost_steps,omitempty"`
	LostStepsFrom string  `json:"lost_steps_from,omitempty"`
}

// How LostSteps was counted in zero-code mode (--watch), where the trainer
// reports nothing.
const (
	// LostFromEstimate: the trainer's step rate, from its successive
	// checkpoints' steps and write times, extrapolated from its newest
	// checkpoint to when it was stopped.
	LostFromEstimate = "estimate"
	// LostFromDir: no rate known (fewer than two checkpoints this
	// session): the newest step seen in the watched directory, a lower
	// bound.
	LostFromDir = "dir"
)

// RestoreEntry records one restore at start.
type RestoreEntry struct {
	At           time.Time `json:"at"`
	CheckpointID string    `json:"checkpoint_id"`
	Step         int64     `json:"step"`
	Manifest     string    `json:"manifest"`
	Bytes        int64     `json:"bytes"`
	Seconds      float64   `json:"seconds"`
	Skipped      []string  `json:"skipped,omitempty"`
	// Node is the part of a multi-node job whose agent restored
	// (node-<k>); empty for a single-node run.
	Node string `json:"node,omitempty"`
	// From is the bytes restored from each source (restore.Result.From:
	// "local", "store"); empty in journals written before it.
	From map[string]int64 `json:"from,omitempty"`
}

// Sources says where the restore's bytes came from (Sources).
func (e RestoreEntry) Sources() string { return Sources(e.From) }

// Sources says where a restore's bytes came from (restore.Result.From), nearest
// first, the store last: "local", "store", "local+store"; "" when nothing
// was read or nothing is known.
func Sources(from map[string]int64) string {
	var out []string
	for s, n := range from {
		if n > 0 && s != checkpoint.FromStore {
			out = append(out, s)
		}
	}
	sort.Strings(out)
	if from[checkpoint.FromStore] > 0 {
		out = append(out, checkpoint.FromStore)
	}
	return strings.Join(out, "+")
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
	// SaveSeconds and CheckpointSeconds are the newest checkpoint's save
	// (request → done) and request → committed; Pipelined: its files were
	// uploaded on `saved`, overlapping the save. They predict a notice
	// checkpoint at the next start (docs/operations.md).
	SaveSeconds       float64 `json:"save_seconds,omitempty"`
	CheckpointSeconds float64 `json:"checkpoint_seconds,omitempty"`
	Pipelined         bool    `json:"pipelined,omitempty"`
}

// MarkFinished records that the session's trainer finished its work,
// with the newest step it reported (none when it reported no step past 0).
func (s *Session) MarkFinished(lastStep int64) {
	s.Finished = true
	if lastStep > 0 {
		s.LastStep = &lastStep
	}
}

// FinishedBefore is the session that ended last, when its trainer had
// finished its work; nil when the run's last ended session was
// interrupted, failed or stopped, or none has ended.
func (j *Journal) FinishedBefore() *Session {
	var last *Session
	for i := range j.Sessions {
		if s := &j.Sessions[i]; s.End != nil && (last == nil || s.End.After(*last.End)) {
			last = s
		}
	}
	if last == nil || !last.Finished {
		return nil
	}
	return last
}

// SessionByID returns the session named id, or nil: an agent updates its
// own session through it, as another node's agent may have appended one
// since (the last session is not necessarily this agent's).
func (j *Journal) SessionByID(id string) *Session {
	if id == "" {
		return nil
	}
	for i := len(j.Sessions) - 1; i >= 0; i-- {
		if j.Sessions[i].ID == id {
			return &j.Sessions[i]
		}
	}
	return nil
}

// maxJournal bounds what is read as a journal.
const maxJournal = 16 << 20

// Read loads the journal; a missing one is an empty journal.
func Read(ctx context.Context, st cloud.Store, runID string) (*Journal, error) {
	j := &Journal{Format: Format, RunID: runID}
	err := checkpoint.ReadJSON(ctx, st, checkpoint.JournalKey, maxJournal, j)
	if err != nil && !errors.Is(err, cloud.ErrNotExist) {
		return nil, fmt.Errorf("journal: %w", err)
	}
	return j, nil
}

// Writer serialises changes to a journal and saves it.
type Writer struct {
	st cloud.Store
	// turn serialises Update, a store round trip or several: a channel,
	// not a mutex, so that a writer waiting for its turn gives up with
	// its context and is durably blocked in a testing/synctest bubble
	// (the agent's simulation, pkg/supervisor/internal/agentsim, where a
	// slow store would otherwise stop the bubble's clock). mu guards the
	// fields below for a moment only: Snapshot never waits on the store.
	turn  chan struct{}
	mu    sync.Mutex
	j     *Journal
	lease *checkpoint.Lease // set: no write once fenced (pkg/checkpoint, latest.go)
}

// NewWriter wraps a journal read with Read.
func NewWriter(st cloud.Store, j *Journal) *Writer {
	return &Writer{st: st, j: j, turn: make(chan struct{}, 1)}
}

// Update applies fn to the journal in the store and saves the result, a
// compare-and-swap: it reads journal.json (stat first, for its version),
// applies fn, and writes if-version (if-absent). When another agent wrote
// in between it reads again and re-applies fn. With a lease (FenceWith),
// a fenced session writes nothing (ErrFenced): the lease is checked before
// the first attempt and after a lost race. fn may run more than once.
func (w *Writer) Update(ctx context.Context, fn func(*Journal)) error {
	select {
	case w.turn <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("write journal: %w", ctx.Err())
	}
	defer func() { <-w.turn }()
	w.mu.Lock()
	lease, runID := w.lease, w.j.RunID
	w.mu.Unlock()
	for attempt := 0; ; attempt++ {
		if lease != nil && attempt == 0 {
			// One List: a session fenced since its last look writes nothing.
			if err := lease.Check(ctx); err != nil {
				return fmt.Errorf("write journal: %w", err)
			}
		}
		opts := cloud.PutOptions{IfAbsent: true}
		j := w.Snapshot()
		info, err := w.st.Stat(ctx, checkpoint.JournalKey)
		switch {
		case err == nil:
			opts = cloud.PutOptions{IfVersion: info.Version}
			// A journal that no longer parses is replaced by this one.
			if fresh, rerr := Read(ctx, w.st, runID); rerr == nil {
				j = fresh
			} else if ctx.Err() != nil {
				return ctx.Err()
			}
		case !errors.Is(err, cloud.ErrNotExist):
			return fmt.Errorf("write journal: %w", err)
		}
		fn(j)
		body, err := json.MarshalIndent(j, "", "  ")
		if err != nil {
			return err
		}
		err = w.st.Put(ctx, checkpoint.JournalKey, bytes.NewReader(body), int64(len(body)), opts)
		if err == nil {
			w.mu.Lock()
			w.j = j
			w.mu.Unlock()
			return nil
		}
		if !errors.Is(err, cloud.ErrPrecondition) || attempt >= 8 {
			return fmt.Errorf("write journal: %w", err)
		}
		if lease != nil {
			// Another writer got there first: perhaps a newer session.
			if err := lease.Check(ctx); err != nil {
				return fmt.Errorf("write journal: %w", err)
			}
		}
	}
}

func (w *Writer) copyOf(j *Journal) *Journal {
	b, _ := json.Marshal(j)
	var c Journal
	_ = json.Unmarshal(b, &c)
	return &c
}

// Snapshot returns a deep copy of the journal.
func (w *Writer) Snapshot() *Journal {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.copyOf(w.j)
}

// FenceWith makes w write nothing once l is fenced.
func (w *Writer) FenceWith(l *checkpoint.Lease) {
	w.mu.Lock()
	w.lease = l
	w.mu.Unlock()
}

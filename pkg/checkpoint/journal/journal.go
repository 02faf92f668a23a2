// Package journal keeps the run's memory across machines (journal.json):
// its sessions, interruptions and restores, and the measurements a
// restarted run's scheduler starts from; Writer updates it by
// compare-and-swap, fenced by the session's lease. Account turns it into
// goodput.
package journal

// The run's journal (journal.json) and its compare-and-swap writer, and
// goodput: the journal's accounting (Account).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/spotagent/spotagent/internal/retry"
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

// RecordInterruption adds rec, or updates the record of the same
// interruption (its Kind, NoticeID and Detected) when rec names a newer
// step, or commits what had failed: a checkpoint that commits after the
// interruption's record was written (zero-code mode's last one, or a stop's
// own upload past its deadline) amends it. The agent's writes land in any
// order, so the newest committed step wins whichever comes last.
// newlyCommitted: the interruption's record is committed now and was not
// before (a commit to count once).
func (j *Journal) RecordInterruption(rec Interruption) (newlyCommitted bool) {
	for i := len(j.Interruptions) - 1; i >= 0; i-- {
		in := &j.Interruptions[i]
		if in.Kind == rec.Kind && in.NoticeID == rec.NoticeID && in.Detected.Equal(rec.Detected) {
			was := in.CommitOK
			if (rec.CommitOK && !was) || (rec.CommitOK == was && rec.Step > in.Step) {
				*in = rec
			}
			return in.CommitOK && !was
		}
	}
	j.Interruptions = append(j.Interruptions, rec)
	return rec.CommitOK
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
	return w.UpdateRetrying(ctx, retry.Policy{Attempts: 1}, fn)
}

// UpdateRetrying is Update made again under p while it fails (p's
// Retryable judges each failure): the write keeps the journal's turn
// across its attempts, so writes land in the order they were asked for,
// never an older one over a newer one. A write that landed though its
// answer was lost (a reset after the store took it; a conditional Put the
// SDK sent again, refused for the copy that had landed) is known by its
// bytes, found in the store at the next attempt, and fn is not applied a
// second time.
func (w *Writer) UpdateRetrying(ctx context.Context, p retry.Policy, fn func(*Journal)) error {
	select {
	case w.turn <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("write journal: %w", ctx.Err())
	}
	defer func() { <-w.turn }()
	var sent []byte // the last body written whose answer was an error
	return retry.Do(ctx, p, func(ctx context.Context) error { return w.update(ctx, fn, &sent) })
}

// update is one attempt of Update, in the writer's turn. *sent is the body
// of a write whose answer was an error: found in the store, it landed.
func (w *Writer) update(ctx context.Context, fn func(*Journal), sent *[]byte) error {
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
		var j *Journal
		info, err := w.st.Stat(ctx, checkpoint.JournalKey)
		switch {
		case err == nil:
			opts = cloud.PutOptions{IfVersion: info.Version}
			raw, rerr := checkpoint.ReadSmall(ctx, w.st, checkpoint.JournalKey, maxJournal)
			if rerr != nil && ctx.Err() != nil {
				return ctx.Err()
			}
			if rerr == nil && *sent != nil && bytes.Equal(raw, *sent) {
				// The write whose answer was lost had landed.
				landed := &Journal{}
				if json.Unmarshal(raw, landed) == nil {
					w.mu.Lock()
					w.j = landed
					w.mu.Unlock()
					return nil
				}
			}
			// A journal that no longer parses is replaced by this one.
			fresh := &Journal{Format: Format, RunID: runID}
			if rerr == nil && json.Unmarshal(raw, fresh) == nil {
				j = fresh
			}
		case !errors.Is(err, cloud.ErrNotExist):
			return fmt.Errorf("write journal: %w", err)
		}
		if j == nil {
			// None in the store, or one that no longer parses: this
			// writer's own copy (copied only then: w.j changes only
			// here, in this writer's turn).
			j = w.Snapshot()
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
		*sent = body
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

// Goodput buckets: every second of a run's wall time (first session's start
// to the last session's end, less the time after a session that finished
// until the next start) falls in exactly one.
const (
	BucketProductive = "productive" // training whose progress was kept
	BucketBlocked    = "blocked"    // trainer blocked in checkpoints (request → done)
	BucketLost       = "lost"       // trained, then thrown away by an interruption
	BucketRestore    = "restore"    // restoring the newest checkpoint at start
	BucketBetween    = "between"    // from an interruption to the next session's start
	// BucketUnprotected is time the trainer ran with nobody able to
	// checkpoint it (it never connected, or left): not goodput, whether
	// or not it was lost in the end.
	BucketUnprotected = "unprotected"
)

// Buckets lists the buckets in report order.
var Buckets = []string{BucketProductive, BucketBlocked, BucketLost, BucketRestore, BucketBetween, BucketUnprotected}

// GoodputSession is the accounting of one session.
type GoodputSession struct {
	Index       int                `json:"index"`
	Start       time.Time          `json:"start"`
	End         time.Time          `json:"end"`
	Instance    string             `json:"instance,omitempty"`
	Interrupted bool               `json:"interrupted"`
	NoticeOK    bool               `json:"notice_committed"`
	Wall        float64            `json:"wall_seconds"`
	Seconds     map[string]float64 `json:"seconds"` // by bucket
}

// Ratio is productive over wall time.
func (s GoodputSession) Ratio() float64 { return ratio(s.Seconds[BucketProductive], s.Wall) }

// Goodput is where a run's wall time went.
type Goodput struct {
	RunID         string             `json:"run_id"`
	Start         time.Time          `json:"start"`
	End           time.Time          `json:"end"`
	Wall          float64            `json:"wall_seconds"`
	Seconds       map[string]float64 `json:"seconds"` // by bucket, over the run
	Ratio         float64            `json:"goodput_ratio"`
	Interruptions int                `json:"interruptions"`
	NoticeCommits int                `json:"notice_commits"`
	Restores      int                `json:"restores"` // restores at a session's start
	Sessions      []GoodputSession   `json:"sessions"`
	// Missing names what the journal lacks; the accounting makes do
	// without it (each entry says how).
	Missing []string `json:"missing,omitempty"`
}

func ratio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return a / b
}

// Account splits the run's wall time into the goodput buckets. now ends a
// session that has none (still running, or its agent died): it is counted
// to its last recorded event, or to now for the newest session.
// An error means there is nothing to account (no sessions).
func Account(j *Journal, now time.Time) (*Goodput, error) {
	if j == nil || len(j.Sessions) == 0 {
		return nil, fmt.Errorf("journal has no sessions")
	}
	g := &Goodput{RunID: j.RunID, Seconds: map[string]float64{}}
	sess := slices.Clone(j.Sessions)
	slices.SortStableFunc(sess, func(a, b Session) int { return a.Start.Compare(b.Start) })
	ends := make([]time.Time, len(sess))
	for i, s := range sess {
		switch {
		case s.End != nil:
			ends[i] = *s.End
		default:
			last := lastEvent(j, s.Start, nextStart(sess, i))
			if i == len(sess)-1 {
				last = now
				g.Missing = append(g.Missing, fmt.Sprintf("session %d has no end (still running, or its agent died): counted to now", i+1))
			} else {
				g.Missing = append(g.Missing, fmt.Sprintf("session %d has no end (its agent died): counted to its last event, the rest as between machines", i+1))
			}
			ends[i] = last
		}
		if ends[i].Before(s.Start) {
			ends[i] = s.Start
		}
	}
	seen := map[int]bool{}
	for i, s := range sess {
		end := ends[i]
		gs := GoodputSession{Index: i + 1, Start: s.Start, End: end, Instance: s.Instance.InstanceID,
			Wall: end.Sub(s.Start).Seconds(), Seconds: map[string]float64{}}
		// The gap before this session: between machines, unless the one
		// before finished (the run waited for nobody: no time of its).
		if i > 0 && s.Start.After(ends[i-1]) && !sess[i-1].Finished {
			gs.Seconds[BucketBetween] += s.Start.Sub(ends[i-1]).Seconds()
			gs.Wall += s.Start.Sub(ends[i-1]).Seconds()
		}
		var restore float64
		for _, r := range j.Restores {
			if !r.At.Before(s.Start) && !r.At.After(end) {
				restore += r.Seconds
				g.Restores++
			}
		}
		cut := end
		var lost float64
		for k, in := range j.Interruptions {
			if seen[k] || in.Detected.Before(s.Start) || in.Detected.After(end) {
				continue
			}
			seen[k] = true
			g.Interruptions++
			gs.Interrupted = true
			if in.CommitOK {
				g.NoticeCommits++
				gs.NoticeOK = true
			}
			lost += in.LostSeconds
			// After the interruption the trainer stops: the rest of the
			// session is time between machines.
			at := in.Detected
			if in.CommitOK && in.Committed != nil {
				at = *in.Committed
			}
			if at.Before(cut) {
				cut = at
			}
		}
		active := cut.Sub(s.Start).Seconds()
		blocked := 0.0
		if s.BlockedSeconds != nil {
			blocked = *s.BlockedSeconds
		} else {
			g.Missing = append(g.Missing, fmt.Sprintf("session %d has no blocked_seconds (journal of an older agent): blocked time counted as productive", i+1))
		}
		gs.split(active, restore, blocked, lost, s.UnprotectedSeconds)
		if failedUnkept(j, s, gs.Interrupted) {
			gs.Seconds[BucketLost] += gs.Seconds[BucketProductive]
			gs.Seconds[BucketProductive] = 0
		}
		gs.Seconds[BucketBetween] += end.Sub(cut).Seconds()
		for _, b := range Buckets {
			g.Seconds[b] += gs.Seconds[b]
		}
		g.Wall += gs.Wall
		g.Sessions = append(g.Sessions, gs)
	}
	for k, in := range j.Interruptions {
		if !seen[k] {
			g.Missing = append(g.Missing, fmt.Sprintf("interruption at %s falls in no session: not counted", in.Detected.Format(time.RFC3339)))
		}
	}
	g.Start, g.End = sess[0].Start, ends[len(ends)-1]
	g.Ratio = ratio(g.Seconds[BucketProductive], g.Wall)
	return g, nil
}

// failedUnkept: the session's trainer failed on its own (an exit code
// other than 0, 75 "interrupted, run me again" and 76 "fenced", no
// interruption in the session) and the run never committed a checkpoint,
// so nothing it trained was kept: its time is lost, not productive (a
// trainer that crashed at once once read "3s trained", goodput 100 %).
func failedUnkept(j *Journal, s Session, interrupted bool) bool {
	if s.ExitCode == nil || interrupted || j.Stats.Checkpoints > 0 {
		return false
	}
	switch *s.ExitCode {
	case 0, 75, 76: // protocol.ExitInterrupted and ExitFenced (pkg/protocol sits above the journal)
		return false
	}
	for _, in := range j.Interruptions {
		if in.CommitOK {
			return false
		}
	}
	return true
}

// nextStart is when the session after i starts (zero for the last).
func nextStart(sess []Session, i int) time.Time {
	if i+1 < len(sess) {
		return sess[i+1].Start
	}
	return time.Time{}
}

// lastEvent is the newest journal timestamp in [from, before) (before zero:
// unbounded), or from.
func lastEvent(j *Journal, from, before time.Time) time.Time {
	last := from
	see := func(t *time.Time) {
		if t != nil && t.After(last) && (before.IsZero() || t.Before(before)) {
			last = *t
		}
	}
	for _, in := range j.Interruptions {
		see(&in.Detected)
		see(in.Done)
		see(in.Committed)
	}
	for _, r := range j.Restores {
		end := r.At.Add(time.Duration(r.Seconds * float64(time.Second)))
		see(&end)
	}
	return last
}

// Money is what a run cost at an hourly price.
type Money struct {
	PricePerHour         float64 `json:"price_per_hour"`
	OnDemandPricePerHour float64 `json:"on_demand_price_per_hour,omitempty"`
	Spend                float64 `json:"spend"`               // machine time × price
	Wasted               float64 `json:"wasted"`              // machine time lost to interruptions × price
	OnDemand             float64 `json:"on_demand,omitempty"` // the same work on demand
	Saving               float64 `json:"saving_vs_on_demand,omitempty"`
}

// Cost prices g. Machines are paid while a session runs, not between
// sessions; interruptions waste lost work, restores and the time on a
// machine after an interruption. On demand, the run would have needed only
// its productive and blocked time.
func (g *Goodput) Cost(price, onDemand float64) Money {
	m := Money{PricePerHour: price, OnDemandPricePerHour: onDemand}
	var machine, wasted float64
	for _, s := range g.Sessions {
		gap := max(s.Wall-s.End.Sub(s.Start).Seconds(), 0) // the time between machines before it, counted in its wall (Account)
		machine += s.Wall - gap
		wasted += s.Seconds[BucketLost] + s.Seconds[BucketRestore] + s.Seconds[BucketBetween] - gap
	}
	m.Spend = price * machine / 3600
	m.Wasted = price * wasted / 3600
	if onDemand > 0 {
		m.OnDemand = onDemand * (g.Seconds[BucketProductive] + g.Seconds[BucketBlocked]) / 3600
		m.Saving = m.OnDemand - m.Spend
	}
	return m
}

// split shares a session's active seconds among its buckets, each capped
// by what the ones before it left: restore, blocked, lost, unprotected
// (nil: a journal of an older agent, none), and the rest productive.
func (gs *GoodputSession) split(active, restore, blocked, lost float64, unprotected *float64) {
	restore = min(restore, active)
	blocked = min(blocked, active-restore)
	lost = min(lost, active-restore-blocked)
	unprot := 0.0
	if unprotected != nil {
		unprot = min(*unprotected, active-restore-blocked-lost)
	}
	gs.Seconds[BucketRestore] += restore
	gs.Seconds[BucketBlocked] += blocked
	gs.Seconds[BucketLost] += lost
	gs.Seconds[BucketUnprotected] += unprot
	gs.Seconds[BucketProductive] += active - restore - blocked - lost - unprot
}

package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/spotagent/spotagent/internal/retry"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// summaryKey is the fleet summary's key at the fleet root (the prefix the
// runs' stores share: s3://bucket/runs for s3://bucket/runs/RUN-ID).
const summaryKey = "fleet-summary.json"

// summaryFormat names the summary schema.
const summaryFormat = "spotagent.fleet/v1"

// maxSummary bounds what is read as a summary: 10,000 runs take ~10 MB.
const maxSummary = 512 << 20

// Summary is every run's Run, keyed by the run's directory under the fleet
// root. It is small next to the journals (one entry of ~1 kB per run)
// and written only by update, a compare-and-swap.
type Summary struct {
	Format  string    `json:"format"`
	Updated time.Time `json:"updated"`
	// Baseline is when a recount last filled the summary with every run
	// under the root. Zero: agents created it (or replaced a damaged one)
	// and it holds only the runs they recorded since, so Load recounts.
	Baseline time.Time       `json:"baseline,omitzero"`
	Runs     map[string]*Run `json:"runs"`
}

// ReadSummary reads the summary at the root of st; a missing one is
// returned as cloud.ErrNotExist.
func ReadSummary(ctx context.Context, st cloud.Store) (*Summary, error) {
	s, _, err := readSummary(ctx, st)
	return s, err
}

func readSummary(ctx context.Context, st cloud.Store) (*Summary, string, error) {
	info, err := st.Stat(ctx, summaryKey)
	if err != nil {
		return nil, "", fmt.Errorf("fleet summary: %w", err)
	}
	b, err := checkpoint.ReadSmall(ctx, st, summaryKey, maxSummary)
	if err != nil {
		return nil, "", fmt.Errorf("fleet summary: %w", err)
	}
	s := &Summary{}
	if err := json.Unmarshal(b, s); err != nil {
		// The version says what a rewrite may replace (update).
		return nil, info.Version, fmt.Errorf("parse fleet summary: %w", err)
	}
	if s.Runs == nil {
		s.Runs = map[string]*Run{}
	}
	return s, info.Version, nil
}

// maxAttempts bounds update's compare-and-swap loop. Each lost race means
// another writer succeeded, so with the jittered backoff below every writer
// of a burst gets through well before it (TestRecordSession_Race).
const maxAttempts = 100

// update applies fn to the summary in st and writes the result with a
// compare-and-swap on the object's version (if-absent when there is none):
// when another writer got there first, it reads again and re-applies fn
// after a short random wait. fn may run more than once. A summary that no
// longer parses is replaced (Recount rebuilds it from the journals).
func update(ctx context.Context, st cloud.Store, fn func(*Summary)) error {
	for attempt := 0; ; attempt++ {
		s, ver, err := readSummary(ctx, st)
		opts := cloud.PutOptions{IfVersion: ver}
		switch {
		case err == nil:
		case errors.Is(err, cloud.ErrNotExist):
			s, opts = &Summary{Runs: map[string]*Run{}}, cloud.PutOptions{IfAbsent: true}
		case ver == "" || ctx.Err() != nil:
			return err
		default:
			// Damaged: replace it, but only the version that was read.
			s = &Summary{Runs: map[string]*Run{}}
		}
		fn(s)
		s.Format, s.Updated = summaryFormat, time.Now().UTC()
		body, err := json.Marshal(s)
		if err != nil {
			return err
		}
		err = st.Put(ctx, summaryKey, bytes.NewReader(body), int64(len(body)), opts)
		if err == nil {
			return nil
		}
		if !errors.Is(err, cloud.ErrPrecondition) || attempt >= maxAttempts {
			return fmt.Errorf("write fleet summary: %w", err)
		}
		// Lost a race: back off a random while that grows with the attempts,
		// so that racing agents spread out instead of colliding again.
		wait := time.Duration(rand.Int64N(int64(10*time.Millisecond) * int64(min(attempt+1, 20))))
		if err := retry.Sleep(ctx, wait); err != nil {
			return err
		}
	}
}

// put replaces the run's entry unless the summary holds one computed from
// a fuller journal (another agent of the same job, a later session).
func (s *Summary) put(r *Run) {
	if cur, ok := s.Runs[r.Dir]; ok && cur.Entries > r.Entries {
		return
	}
	s.Runs[r.Dir] = r
}

// RecordSession refreshes the run's entry in the fleet summary at the root
// of fleetStore from the run's journal j, as it stands at the end of a
// session: dir is the run's prefix under the fleet root (its run id with
// --store-prefix), step its newest committed step (0 if none). The entry is
// recomputed from the whole journal, so calling it again (a retry, another
// agent of the same job) never counts a session twice.
func RecordSession(ctx context.Context, fleetStore cloud.Store, dir string, j *checkpoint.Journal, step int64) error {
	r, err := runFromJournal(j, dir, step, time.Now())
	if err != nil {
		return fmt.Errorf("fleet summary: %w", err)
	}
	return update(ctx, fleetStore, func(s *Summary) { s.put(r) })
}

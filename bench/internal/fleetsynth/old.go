package fleetsynth

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"time"

	"github.com/spotagent/spotagent/internal/retry"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud"
	"github.com/spotagent/spotagent/pkg/fleet"
)

// The fleet summary as agents wrote it before issue 40 (pkg/fleet at
// b5d8f13, summary.go): one object, fleet-summary.json at the fleet root,
// that every agent reads whole and rewrites with a compare-and-swap at the
// end of each session, up to 100 attempts, and that every agent reads
// whole at start for its prior. Kept here, for the bench only, to measure
// it beside its replacement in the same run.

const (
	// OldSummaryKey is where the summary was, at the fleet root.
	OldSummaryKey  = "fleet-summary.json"
	oldMaxAttempts = 100
)

// OldSummary is fleet-summary.json before issue 40.
type OldSummary struct {
	Format   string                `json:"format"`
	Updated  time.Time             `json:"updated"`
	Baseline time.Time             `json:"baseline,omitzero"`
	Runs     map[string]*fleet.Run `json:"runs"`
}

// ReadOldSummary reads the summary and its ETag.
func ReadOldSummary(ctx context.Context, st cloud.Store) (*OldSummary, string, error) {
	info, err := st.Stat(ctx, OldSummaryKey)
	if err != nil {
		return nil, "", fmt.Errorf("fleet summary: %w", err)
	}
	b, err := checkpoint.ReadSmall(ctx, st, OldSummaryKey, 1<<30)
	if err != nil {
		return nil, "", fmt.Errorf("fleet summary: %w", err)
	}
	s := &OldSummary{}
	if err := json.Unmarshal(b, s); err != nil {
		return nil, info.Version, fmt.Errorf("parse fleet summary: %w", err)
	}
	if s.Runs == nil {
		s.Runs = map[string]*fleet.Run{}
	}
	return s, info.Version, nil
}

func oldUpdate(ctx context.Context, st cloud.Store, fn func(*OldSummary)) error {
	for attempt := 0; ; attempt++ {
		s, ver, err := ReadOldSummary(ctx, st)
		opts := cloud.PutOptions{IfVersion: ver}
		switch {
		case err == nil:
		case errors.Is(err, cloud.ErrNotExist):
			s, opts = &OldSummary{Runs: map[string]*fleet.Run{}}, cloud.PutOptions{IfAbsent: true}
		case ver == "" || ctx.Err() != nil:
			return err
		default:
			s = &OldSummary{Runs: map[string]*fleet.Run{}}
		}
		fn(s)
		s.Format, s.Updated = "spotagent.fleet/v1", time.Now().UTC()
		body, err := json.Marshal(s)
		if err != nil {
			return err
		}
		err = st.Put(ctx, OldSummaryKey, bytes.NewReader(body), int64(len(body)), opts)
		if err == nil {
			return nil
		}
		if !errors.Is(err, cloud.ErrPrecondition) || attempt >= oldMaxAttempts {
			return fmt.Errorf("write fleet summary: %w", err)
		}
		wait := time.Duration(rand.Int64N(int64(10*time.Millisecond) * int64(min(attempt+1, 20))))
		if err := retry.Sleep(ctx, wait); err != nil {
			return err
		}
	}
}

// RecordOldSession is the agent's session-end call before issue 40.
func RecordOldSession(ctx context.Context, st cloud.Store, dir string, j *checkpoint.Journal, step int64) error {
	r, err := fleet.RunOf(j, dir, step, time.Now())
	if err != nil {
		return err
	}
	return oldUpdate(ctx, st, func(s *OldSummary) {
		if cur, ok := s.Runs[r.Dir]; ok && cur.Entries > r.Entries {
			return
		}
		s.Runs[r.Dir] = r
	})
}

// OldPrior is the agent's start-up read before issue 40: the whole summary.
func OldPrior(ctx context.Context, st cloud.Store, k fleet.Key) (fleet.Prior, error) {
	s, _, err := ReadOldSummary(ctx, st)
	if err != nil {
		return fleet.Prior{}, err
	}
	return fleet.PriorFor(&fleet.Summary{Runs: s.Runs}, k, 0.05, fleet.DefaultMinHours), nil
}

// PutOldSummary writes a v1 summary of n synthetic runs, as agents before
// issue 40 left it at the fleet root, and returns its size.
func PutOldSummary(ctx context.Context, st cloud.Store, n int) (int, error) {
	rng := rand.New(rand.NewPCG(29, uint64(n)))
	base := time.Now().Add(-60 * 24 * time.Hour).UTC().Truncate(time.Second)
	s := OldSummary{Format: "spotagent.fleet/v1", Updated: time.Now().UTC(), Baseline: time.Now().UTC(), Runs: map[string]*fleet.Run{}}
	for i := range n {
		j, step, _ := Journal(rng, i, base)
		r, err := fleet.RunOf(j, j.RunID, step, time.Now())
		if err != nil {
			return 0, err
		}
		s.Runs[r.Dir] = r
	}
	body, err := json.Marshal(s)
	if err != nil {
		return 0, err
	}
	return len(body), st.Put(ctx, OldSummaryKey, bytes.NewReader(body), int64(len(body)), cloud.PutOptions{})
}

// OldReport is what `spotagent fleet` did before issue 40, in process.
func OldReport(ctx context.Context, st cloud.Store) error {
	s, _, err := ReadOldSummary(ctx, st)
	if err != nil {
		return err
	}
	rep, err := fleet.Build(&fleet.Summary{Runs: s.Runs}, fleet.Options{Now: time.Now()}, "summary", nil)
	if err != nil {
		return err
	}
	return fleet.Write(io.Discard, rep, "table")
}

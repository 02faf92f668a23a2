package main

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
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
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
	oldSummaryKey  = "fleet-summary.json"
	oldMaxAttempts = 100
)

type oldSummary struct {
	Format   string                `json:"format"`
	Updated  time.Time             `json:"updated"`
	Baseline time.Time             `json:"baseline,omitzero"`
	Runs     map[string]*fleet.Run `json:"runs"`
}

func oldReadSummary(ctx context.Context, st cloud.Store) (*oldSummary, string, error) {
	info, err := st.Stat(ctx, oldSummaryKey)
	if err != nil {
		return nil, "", fmt.Errorf("fleet summary: %w", err)
	}
	b, err := checkpoint.ReadSmall(ctx, st, oldSummaryKey, 1<<30)
	if err != nil {
		return nil, "", fmt.Errorf("fleet summary: %w", err)
	}
	s := &oldSummary{}
	if err := json.Unmarshal(b, s); err != nil {
		return nil, info.Version, fmt.Errorf("parse fleet summary: %w", err)
	}
	if s.Runs == nil {
		s.Runs = map[string]*fleet.Run{}
	}
	return s, info.Version, nil
}

func oldUpdate(ctx context.Context, st cloud.Store, fn func(*oldSummary)) error {
	for attempt := 0; ; attempt++ {
		s, ver, err := oldReadSummary(ctx, st)
		opts := cloud.PutOptions{IfVersion: ver}
		switch {
		case err == nil:
		case errors.Is(err, cloud.ErrNotExist):
			s, opts = &oldSummary{Runs: map[string]*fleet.Run{}}, cloud.PutOptions{IfAbsent: true}
		case ver == "" || ctx.Err() != nil:
			return err
		default:
			s = &oldSummary{Runs: map[string]*fleet.Run{}}
		}
		fn(s)
		s.Format, s.Updated = "spotagent.fleet/v1", time.Now().UTC()
		body, err := json.Marshal(s)
		if err != nil {
			return err
		}
		err = st.Put(ctx, oldSummaryKey, bytes.NewReader(body), int64(len(body)), opts)
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

// oldRecordSession is the agent's session-end call before issue 40.
func oldRecordSession(ctx context.Context, st cloud.Store, dir string, j *journal.Journal, step int64) error {
	r, err := fleet.RunOf(j, dir, step, time.Now())
	if err != nil {
		return err
	}
	return oldUpdate(ctx, st, func(s *oldSummary) {
		if cur, ok := s.Runs[r.Dir]; ok && cur.Entries > r.Entries {
			return
		}
		s.Runs[r.Dir] = r
	})
}

// oldPrior is the agent's start-up read before issue 40: the whole summary.
func oldPrior(ctx context.Context, st cloud.Store, k fleet.Key) (fleet.Prior, error) {
	s, _, err := oldReadSummary(ctx, st)
	if err != nil {
		return fleet.Prior{}, err
	}
	return fleet.PriorFor(&fleet.Summary{Runs: s.Runs}, k, 0.05, fleet.DefaultMinHours), nil
}

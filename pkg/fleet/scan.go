package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// Damaged names a journal that did not read cleanly and what it lost.
// Counted says whether the rest of it is in the figures.
type Damaged struct {
	Key      string   `json:"key"`
	Problems []string `json:"problems"`
	Counted  bool     `json:"counted"`
}

// recountWorkers bounds the journals read at once.
const recountWorkers = 16

// Recount reads every run journal under the root of st (any key named
// journal.json, at any depth) and returns a summary built from them, with
// the journals that were damaged. A journal that parses in part is
// salvaged (journal.Salvage) and counted; one with nothing left
// to account is named and skipped. now ends sessions that have no end.
func Recount(ctx context.Context, st cloud.Store, now time.Time) (*Summary, []Damaged, error) {
	var keys []string
	err := st.List(ctx, "", func(o cloud.ObjectInfo) error {
		if path.Base(o.Key) == checkpoint.JournalKey {
			keys = append(keys, o.Key)
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("list journals: %w", err)
	}
	s := &Summary{Format: summaryFormat, Updated: now.UTC(), Runs: map[string]*Run{}}
	var (
		mu      sync.Mutex
		damaged []Damaged
		wg      sync.WaitGroup
		next    = make(chan string)
	)
	for range min(recountWorkers, len(keys)) {
		wg.Go(func() {
			for key := range next {
				r, dmg := readRun(ctx, st, key, now)
				mu.Lock()
				if r != nil {
					s.Runs[r.Dir] = r
				}
				if dmg != nil {
					damaged = append(damaged, *dmg)
				}
				mu.Unlock()
			}
		})
	}
	for _, k := range keys {
		select {
		case next <- k:
		case <-ctx.Done():
		}
	}
	close(next)
	wg.Wait()
	if ctx.Err() != nil {
		return nil, nil, ctx.Err()
	}
	slices.SortFunc(damaged, func(a, b Damaged) int { return strings.Compare(a.Key, b.Key) })
	return s, damaged, nil
}

// readRun reads one journal and the step of the run's latest.json.
func readRun(ctx context.Context, st cloud.Store, key string, now time.Time) (*Run, *Damaged) {
	dir := strings.TrimSuffix(strings.TrimSuffix(key, checkpoint.JournalKey), "/")
	b, err := checkpoint.ReadSmall(ctx, st, key, 16<<20)
	if err != nil {
		return nil, &Damaged{Key: key, Problems: []string{err.Error()}}
	}
	j, damage := journal.Salvage(b)
	if len(j.Sessions) == 0 && len(damage) == 0 {
		return nil, nil // a run that has not started a session yet
	}
	if j.RunID == "" {
		j.RunID = path.Base("/" + dir)
	}
	r, err := runFromJournal(j, dir, latestStep(ctx, st, dir), now)
	if err != nil {
		return nil, &Damaged{Key: key, Problems: append(damage, err.Error())}
	}
	if len(damage) == 0 {
		return r, nil
	}
	r.Damage = damage
	return r, &Damaged{Key: key, Problems: damage, Counted: true}
}

// latestStep is the step of the run's newest committed checkpoint, or 0.
func latestStep(ctx context.Context, st cloud.Store, dir string) int64 {
	b, err := checkpoint.ReadSmall(ctx, st, path.Join(dir, checkpoint.LatestKey), 1<<20)
	if err != nil {
		return 0
	}
	var l struct {
		Step int64 `json:"step"`
	}
	if json.Unmarshal(b, &l) != nil {
		return 0
	}
	return l.Step
}

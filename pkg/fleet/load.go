package fleet

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"time"

	"github.com/spotagent/spotagent/pkg/cloud"
)

// Loaded is what Load found.
type Loaded struct {
	Summary *Summary
	Source  string    // "summary" or "recount"
	Damaged []Damaged // journals a recount could not read cleanly, records that do not parse
	// SaveErr is why the compaction that folds the session records (and a
	// recount that had to be saved) into the summary could not be written:
	// the report stands, the next one reads the records again.
	SaveErr error
}

// Load returns the runs of the fleet at the root of st: the summary with
// every session record since merged, or every journal under the root
// when recount is set or the summary is not complete (none yet, or one no
// recount has filled with the runs from before: Summary.Baseline is zero).
// It then compacts, best effort (SaveErr): the records it read and any
// recount go into the summary, the prior sums are rewritten and the
// records it took in are deleted. With recount, only when save is set
// (then a failure is an error). A summary that does not parse is an error
// unless recount.
func Load(ctx context.Context, st cloud.Store, recount, save bool, now time.Time) (*Loaded, error) {
	s, err := readState(ctx, st)
	if err != nil {
		return nil, err
	}
	if s.snapErr != nil && !recount {
		return nil, fmt.Errorf("%w (--recount reads the journals instead)", s.snapErr)
	}
	l := &Loaded{Summary: s.merged, Source: "summary", Damaged: s.badRecords}
	if !recount && s.snap != nil && !s.snap.Baseline.IsZero() {
		if len(s.records) > 0 || len(s.badRecords) > 0 || s.legacy != "" {
			l.SaveErr = ignoreRace(compact(ctx, st, s, s.merged))
		}
		return l, nil
	}
	rc, damaged, err := Recount(ctx, st, now)
	if err != nil {
		return nil, err
	}
	next := &Summary{Runs: maps.Clone(s.merged.Runs), Legacy: s.merged.Legacy}
	for _, r := range rc.Runs {
		next.put(r) // keeps a record computed from a fuller journal
	}
	next.Baseline = now.UTC()
	l.Summary, l.Source, l.Damaged = next, "recount", append(damaged, s.badRecords...)
	if save || !recount {
		err = ignoreRace(compact(ctx, st, s, next))
		if err != nil && save {
			return nil, err
		}
		l.SaveErr = err
	}
	return l, nil
}

// ignoreRace: a compaction that lost to another is no failure.
func ignoreRace(err error) error {
	if errors.Is(err, errCompacted) {
		return nil
	}
	return err
}

// ParseSince parses --since: a Go duration (36h) or a number of days (30d).
func ParseSince(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	if d, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseFloat(d, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("--since %q: want a duration (36h) or days (30d)", s)
		}
		return time.Duration(n * 24 * float64(time.Hour)), nil
	}
	v, err := time.ParseDuration(s)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("--since %q: want a duration (36h) or days (30d)", s)
	}
	return v, nil
}

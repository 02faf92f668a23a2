package fleet

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
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
	compact func(ctx context.Context) error
}

// Pending reports whether Compact has anything to write: session records,
// a v1 summary or a recount not yet in the summary.
func (l *Loaded) Pending() bool { return l.compact != nil }

// Compact folds what Load read (the session records, a v1 summary, a
// recount that had to be saved) into the summary and deletes the records
// it took in: `fleet --save-summary`, after the report is out (a read
// alone writes nothing). An error (a read-only
// credential) leaves the fleet as it was: the next Load reads the same.
func (l *Loaded) Compact(ctx context.Context) error {
	if l.compact == nil {
		return nil
	}
	return ignoreRace(l.compact(ctx))
}

// Load returns the runs of the fleet at the root of st: the summary with
// every session record since merged, or every journal under the root
// when recount is set or the summary is not complete (none yet, or one no
// recount has filled with the runs from before: Summary.Baseline is zero).
// Loaded.Compact then folds the records it read and any recount into the
// summary, rewrites the prior sums and deletes the records it took in.
// With recount and save, Load compacts itself (a failure is an error). A
// summary that does not parse is an error unless recount.
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
			l.compact = func(ctx context.Context) error { return compact(ctx, st, s, s.merged) }
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
	switch {
	case save:
		if err := ignoreRace(compact(ctx, st, s, next)); err != nil {
			return nil, err
		}
	case !recount:
		l.compact = func(ctx context.Context) error { return compact(ctx, st, s, next) }
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
		// NaN fails both comparisons; above ~106,000 days the duration overflows.
		if err != nil || !(n >= 0) || n*24 > float64(math.MaxInt64/int64(time.Hour)) {
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

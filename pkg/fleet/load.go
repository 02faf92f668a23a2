package fleet

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/spotagent/spotagent/pkg/cloud"
)

// Loaded is what Load found.
type Loaded struct {
	Summary *Summary
	Source  string    // "summary" or "recount"
	Damaged []Damaged // journals a recount could not read cleanly
	// SaveErr is why a recount that had to be saved (no complete summary
	// yet) could not be: the report stands, the next one recounts again.
	SaveErr error
}

// Load returns the runs under the root of st: from the summary, or from
// every journal when recount is set or the summary is not complete (none
// yet, or one that agents started and no recount has filled with the runs
// from before: Summary.Baseline is zero). A recount is written back as the
// summary when save is set (an error) or the summary was not complete (best
// effort, SaveErr), keeping any entry an agent refreshed meanwhile from a
// fuller journal. A summary that does not parse is an error unless recount.
func Load(ctx context.Context, st cloud.Store, recount, save bool, now time.Time) (*Loaded, error) {
	if !recount {
		s, err := ReadSummary(ctx, st)
		switch {
		case err == nil && !s.Baseline.IsZero():
			return &Loaded{Summary: s, Source: "summary"}, nil
		case err == nil, errors.Is(err, cloud.ErrNotExist):
			// Not complete: recount, and save it so that the next is fast.
		default:
			return nil, fmt.Errorf("%w (--recount reads the journals instead)", err)
		}
	}
	s, damaged, err := Recount(ctx, st, now)
	if err != nil {
		return nil, err
	}
	l := &Loaded{Summary: s, Source: "recount", Damaged: damaged}
	if save || !recount {
		err = update(ctx, st, func(cur *Summary) {
			old := cur.Runs
			cur.Runs = map[string]*Run{}
			for _, r := range s.Runs {
				if o, ok := old[r.Dir]; ok && o.Entries > r.Entries {
					r = o
				}
				cur.Runs[r.Dir] = r
			}
			for dir, o := range old { // recorded after the listing
				if _, ok := cur.Runs[dir]; !ok {
					cur.Runs[dir] = o
				}
			}
			cur.Baseline = now.UTC()
		})
		if err != nil && save {
			return nil, err
		}
		l.SaveErr = err
	}
	return l, nil
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

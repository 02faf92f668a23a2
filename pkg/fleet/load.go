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

// Load returns the runs under the root of st: from the summary, or from
// every journal when recount is set or there is no summary yet (source
// says which: "summary" or "recount"). With save, a recount is written back
// as the summary (Update: an entry an agent refreshed meanwhile from a
// fuller journal is kept).
func Load(ctx context.Context, st cloud.Store, recount, save bool, now time.Time) (s *Summary, source string, damaged []Damaged, err error) {
	if !recount {
		s, err = ReadSummary(ctx, st)
		if err == nil {
			return s, "summary", nil, nil
		}
		if !errors.Is(err, cloud.ErrNotExist) {
			return nil, "", nil, fmt.Errorf("%w (--recount reads the journals instead)", err)
		}
	}
	s, damaged, err = Recount(ctx, st, now)
	if err != nil {
		return nil, "", nil, err
	}
	if save {
		err = Update(ctx, st, func(cur *Summary) {
			old := cur.Runs
			cur.Runs = map[string]*Run{}
			for _, r := range s.Runs {
				if o, ok := old[r.Dir]; ok && o.Entries > r.Entries {
					r = o
				}
				cur.Runs[r.Dir] = r
			}
		})
		if err != nil {
			return nil, "", nil, err
		}
	}
	return s, "recount", damaged, nil
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

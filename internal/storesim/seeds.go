package storesim

import (
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Seeds runs a simulation's schedules, one seed each, the way every
// simulation test here does:
//   - SPOTAGENT_SIM_SEED=<seed>: that seed alone, its schedule logged (a
//     replay of a failure);
//   - else SPOTAGENT_SIM_SCHEDULES seeds (default Schedules, at most Short
//     under -short) from SPOTAGENT_SIM_FIRST (default 1), on Workers
//     goroutines side by side, until SPOTAGENT_SIM_MAXFAIL (default 3)
//     schedules have failed.
//
// Each failure is reported with t.Error, a replay's with t.Fatal.
type Seeds struct {
	Schedules uint64
	Short     uint64 // the most schedules under -short; 0: no cap
	Workers   int    // 0: GOMAXPROCS
	// Run runs the schedule of one seed and returns its steps and, when
	// the schedule broke a property, the report to print ("" when not).
	Run func(seed uint64) (trace []string, failure string)
}

// SeedsRun is what Seeds.Test ran: N schedules in Took, or one replayed.
type SeedsRun struct {
	N      uint64
	Took   time.Duration
	Replay bool
	Failed uint64
}

// Test runs the schedules.
func (s Seeds) Test(t testing.TB) SeedsRun {
	t.Helper()
	if v := os.Getenv("SPOTAGENT_SIM_SEED"); v != "" {
		trace, failure := s.Run(envUint(t, "SPOTAGENT_SIM_SEED", 0))
		for _, l := range trace {
			t.Log(l)
		}
		if failure != "" {
			t.Fatal(failure)
		}
		return SeedsRun{N: 1, Replay: true}
	}
	n := envUint(t, "SPOTAGENT_SIM_SCHEDULES", s.Schedules)
	if testing.Short() && s.Short > 0 {
		n = min(n, s.Short)
	}
	first := envUint(t, "SPOTAGENT_SIM_FIRST", 1)
	maxFail := envUint(t, "SPOTAGENT_SIM_MAXFAIL", 3)
	workers := s.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	if os.Getenv("GOGC") == "" {
		defer debug.SetGCPercent(debug.SetGCPercent(simGCPercent))
	}
	start := time.Now()
	var next, fails atomic.Uint64
	next.Store(first)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				seed := next.Add(1) - 1
				if seed >= first+n || fails.Load() >= maxFail {
					return
				}
				if _, failure := s.Run(seed); failure != "" {
					fails.Add(1)
					t.Error(failure)
				}
			}
		})
	}
	wg.Wait()
	return SeedsRun{N: n, Took: time.Since(start), Failed: fails.Load()}
}

// simGCPercent is the collector's target while the schedules run (GOGC,
// when set, wins). A simulation's live heap stays small (under 40 MB at
// 400; 25 MB at Go's default of 100) while each schedule allocates and
// drops a great deal, so at 100 the collector ran so often that it took
// about a quarter of the run: 10,000 store schedules in 23.6 s median at
// 100, 15.9 s at 400; 2,000 agent schedules 16.4 s and 11.4 s (one run,
// alternating, on 2 quiet cores).
const simGCPercent = 400

// envUint is the environment variable name as a number, def when unset.
func envUint(t testing.TB, name string, def uint64) uint64 {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return n
}

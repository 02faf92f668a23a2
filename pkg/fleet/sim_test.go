package fleet

import (
	"context"
	"fmt"
	"maps"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spotagent/spotagent/internal/storesim"
	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
)

// The fleet records' protocol, checked by deterministic simulation (issue
// 40; the machinery is pkg/checkpoint/commit's, storesim.Sched). Each seed draws
// one small schedule over one in-memory store: two or three agents, each
// recording one or two session ends of its own run (RecordSession), and
// one or two `spotagent fleet` (Load, then Compact, one to three times), with
// or without a complete summary to start from, faults on any operation
// (fails, reply lost, the process dies) and lists that lag. The actors run
// the real code one store operation at a time in an order drawn from the
// seed.
//
// The property (docs/reliability.md), checked after every write or delete
// and at the end (then again after a last compaction without faults, which
// must leave no record behind): in the fleet a fresh Load returns, every
// run whose session record RecordSession acknowledged holds at least that
// record's sessions, never more than its agent ever tried to record, and
// its machine time is exactly its sessions' (no session counted twice);
// no run appears that no agent recorded. With lists that do not lag, the
// same holds for each `fleet`'s own Load against the records acknowledged
// before it began (with lagging lists a record just written may be missing
// from one report, never from the store).
//
// A failure prints its seed and schedule; replay one with
// SPOTAGENT_SIM_SEED=<seed> go test ./pkg/fleet -run 'TestFleetSim$' -v.
// SPOTAGENT_SIM_SCHEDULES and SPOTAGENT_SIM_FIRST choose the seeds.
//
// Determinism: every store call of an actor is made from one goroutine at
// a time (ioWorkers is 1 here); the agents' runs file their records under
// one instance type (one prior object), so no map order decides an order
// of calls; a record's name ends in random hex, which orders nothing
// (names differ earlier) but shows in the schedule. RecordSession's
// back-off between attempts is a real (short) sleep, during which the
// schedule waits: schedules run side by side to overlap them.

// fleetSimNow is the `spotagent fleet` clock (recounts end open sessions
// with it; the simulated runs have none).
var fleetSimNow = at(100 * time.Hour)

// fleetSimSessionSeconds is each simulated session's machine time.
const fleetSimSessionSeconds = 50 * 60

type fleetSim struct {
	seed uint64
	st   *storesim.Store
	sc   *storesim.Sched

	mu      sync.Mutex
	acked   map[string]int // run dir: the most sessions of a record RecordSession acknowledged
	tried   map[string]int // run dir: the most sessions of a record it was asked to write
	checked int64          // the store tick last checked
	checks  int
	// compactions counts the compactions that had something to fold and
	// returned no error (one that lost the race to another included).
	compactions int
	bad         []string
}

func (w *fleetSim) failed() bool { return len(w.bad) > 0 }

func (w *fleetSim) report() string {
	var b strings.Builder
	fmt.Fprintf(&b, "fleet simulation seed %d failed (replay: SPOTAGENT_SIM_SEED=%d go test ./pkg/fleet -run 'TestFleetSim$' -v):\n", w.seed, w.seed)
	for _, v := range w.bad {
		fmt.Fprintf(&b, "  VIOLATION %s\n", v)
	}
	b.WriteString("schedule:\n")
	for _, l := range w.sc.Trace {
		fmt.Fprintf(&b, "  %s\n", l)
	}
	return b.String()
}

func (w *fleetSim) violate(format string, args ...any) {
	if len(w.bad) < 5 {
		w.bad = append(w.bad, fmt.Sprintf("step %d: ", len(w.sc.Trace))+fmt.Sprintf(format, args...))
	}
}

// runFleetSim runs the schedule of one seed.
func runFleetSim(seed uint64) *fleetSim {
	w := &fleetSim{seed: seed, st: storesim.New(), sc: storesim.NewSched(seed),
		acked: map[string]int{}, tried: map[string]int{}, checked: -1}
	r := w.sc.Rand()
	clock := t0
	w.st.Clock = func() time.Time { clock = clock.Add(time.Second); return clock }
	if r.IntN(2) == 0 {
		// A complete summary (a recount of an empty fleet) to compact
		// into; otherwise the first compaction recounts and creates it.
		if _, err := Load(context.Background(), w.st, true, true, fleetSimNow); err != nil {
			w.violate("first recount: %v", err)
			return w
		}
	}
	w.st.Faults = w.sc
	w.sc.Check = w.onOp
	w.st.Lag = [...]int64{0, 0, 1, 3}[r.IntN(4)]
	w.sc.FailRate = [...]float64{0, 0.03, 0.1}[r.IntN(3)]
	w.sc.LostRate = [...]float64{0, 0.05}[r.IntN(2)]
	w.sc.CrashRate = [...]float64{0, 0.01, 0.04}[r.IntN(3)]
	w.sc.MaxSteps = 1000
	for i := range 2 + r.IntN(2) {
		dir := fmt.Sprintf("run-%d", i)
		sessions := 1 + r.IntN(2)
		w.sc.Go(fmt.Sprintf("agent%d", i), nil, func(ctx context.Context) { w.agent(ctx, dir, sessions) })
	}
	for i := range 1 + r.IntN(2) {
		rounds := 1 + r.IntN(3)
		w.sc.Go(fmt.Sprintf("fleet%d", i), nil, func(ctx context.Context) { w.compactor(ctx, rounds) })
	}
	if err := w.sc.Run(); err != nil {
		w.violate("%v", err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.checkLocked()
	// A last `spotagent fleet` without faults folds every record left.
	l, err := Load(context.Background(), w.st, false, false, fleetSimNow)
	if err == nil {
		err = l.Compact(context.Background())
	}
	if err != nil {
		w.violate("last compaction: %v", err)
		return w
	}
	w.checkLocked()
	for _, o := range w.st.Snapshot() {
		if strings.HasPrefix(o.Key, recordsPrefix) {
			w.violate("record %s left after the last compaction", o.Key)
		}
	}
	return w
}

// agent is one run's agent: a session ends, its record is written (what
// the agent's call site does), and so on; a failed record is logged and
// the run goes on, unless the process died.
func (w *fleetSim) agent(ctx context.Context, dir string, sessions int) {
	j := &journal.Journal{Format: journal.Format, RunID: dir}
	for s := range sessions {
		session(j, s, []checkpoint.Machine{p4dA, p4dB}[s%2])
		w.mu.Lock()
		w.tried[dir] = s + 1
		w.mu.Unlock()
		err := RecordSession(ctx, w.st, dir, j, int64(s+1))
		if err == nil {
			w.mu.Lock()
			w.acked[dir] = s + 1
			w.mu.Unlock()
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// compactor is `spotagent fleet` (cmd/spotagent/fleet.go): Load, the
// report, then Compact; run rounds times.
func (w *fleetSim) compactor(ctx context.Context, rounds int) {
	for range rounds {
		w.mu.Lock()
		before := maps.Clone(w.acked)
		w.mu.Unlock()
		l, err := Load(ctx, w.st, false, false, fleetSimNow)
		if err == nil && w.st.Lag == 0 {
			// Its report: every record acknowledged before it began
			// (unless lists lag: then a record just written may be
			// missing from it, though never from the store).
			w.mu.Lock()
			w.holds(storesim.ActorOf(ctx).Name+"'s load", l.Summary, before)
			w.mu.Unlock()
		}
		if err == nil && l.compact != nil && l.Compact(ctx) == nil {
			w.mu.Lock()
			w.compactions++
			w.mu.Unlock()
		}
		if ctx.Err() != nil {
			return
		}
		// A failed one leaves the fleet as it was.
	}
}

// onOp is storesim.Sched's Check: once a write or delete ran, the fleet
// as a fresh Load sees it.
func (w *fleetSim) onOp(a *storesim.Actor, op storesim.Op, ran bool, err error) {
	if !ran || err != nil || op.Kind != storesim.OpPut && op.Kind != storesim.OpDelete {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.checkLocked()
}

// checkLocked loads the fleet (an oracle's context: no faults, no lag)
// and holds it to what the agents were told.
func (w *fleetSim) checkLocked() {
	tick := w.st.Tick()
	if tick == w.checked {
		return
	}
	w.checked = tick
	w.checks++
	l, err := Load(context.Background(), w.st, false, false, fleetSimNow)
	if err != nil {
		w.violate("load: %v", err)
		return
	}
	w.holds("the fleet", l.Summary, w.acked)
}

// holds checks a fleet s that Load returned against acked, the records
// acknowledged before that Load began, and everything ever tried.
func (w *fleetSim) holds(who string, s *Summary, acked map[string]int) {
	for _, dir := range slices.Sorted(maps.Keys(acked)) {
		want := acked[dir]
		r := s.Runs[dir]
		switch {
		case r == nil:
			w.violate("%s: %s: acknowledged record of %d sessions lost: no such run", who, dir, want)
		case r.Sessions < want:
			w.violate("%s: %s: acknowledged record of %d sessions lost: %d sessions", who, dir, want, r.Sessions)
		}
	}
	for dir, r := range s.Runs {
		tried, ok := w.tried[dir]
		switch {
		case !ok:
			w.violate("%s: %s, but no agent recorded it", who, dir)
		case r.Sessions > tried:
			w.violate("%s: %s: %d sessions, its agent recorded at most %d", who, dir, r.Sessions, tried)
		case !near(r.Total().Machine, float64(r.Sessions*fleetSimSessionSeconds)):
			w.violate("%s: %s: %v machine seconds for %d sessions of %d s (counted twice?)", who, dir, r.Total().Machine, r.Sessions, fleetSimSessionSeconds)
		}
	}
}

// oneCallAtATime makes every actor's store calls one at a time (see the
// determinism note above) for the test.
func oneCallAtATime(t *testing.T) {
	old := ioWorkers
	ioWorkers = 1
	t.Cleanup(func() { ioWorkers = old })
}

func TestFleetSim(t *testing.T) {
	oneCallAtATime(t)
	var steps, checks, acked, compactions atomic.Uint64
	run := storesim.Seeds{
		Schedules: fleetSimDefault,
		Short:     200,
		Workers:   max(8, 4*runtime.GOMAXPROCS(0)), // RecordSession's back-off sleeps for real
		Run: func(seed uint64) ([]string, string) {
			w := runFleetSim(seed)
			steps.Add(uint64(len(w.sc.Trace)))
			checks.Add(uint64(w.checks))
			acked.Add(uint64(len(w.acked)))
			compactions.Add(uint64(w.compactions))
			if w.failed() {
				return w.sc.Trace, w.report()
			}
			return w.sc.Trace, ""
		},
	}.Test(t)
	if run.Replay {
		return
	}
	t.Logf("%d schedules in %s: %.0f schedules/s; %d steps, %d checks, %d runs with an acknowledged record, %d compactions",
		run.N, run.Took.Round(time.Millisecond), float64(run.N)/run.Took.Seconds(), steps.Load(), checks.Load(), acked.Load(), compactions.Load())
	if run.Failed == 0 && (acked.Load() == 0 || compactions.Load() == 0) {
		t.Error("no record was acknowledged, or no compaction ran while agents recorded: the schedules test nothing")
	}
}

// recordHex is the random tail of a record's name: it orders nothing, but
// shows in a schedule.
var recordHex = regexp.MustCompile(`\.[0-9a-f]{12}\.json`)

// TestFleetSimDeterministic: one seed, one schedule, step for step (but
// for the random tail of the record names).
func TestFleetSimDeterministic(t *testing.T) {
	oneCallAtATime(t)
	for _, seed := range []uint64{3, 17} {
		a, b := runFleetSim(seed), runFleetSim(seed)
		ta := recordHex.ReplaceAllString(strings.Join(a.sc.Trace, "\n"), ".X.json")
		tb := recordHex.ReplaceAllString(strings.Join(b.sc.Trace, "\n"), ".X.json")
		if ta != tb {
			t.Errorf("seed %d: two runs differ:\n%s\n---\n%s", seed, ta, tb)
		}
		if len(a.sc.Trace) < 15 {
			t.Errorf("seed %d: %d steps, want a real schedule", seed, len(a.sc.Trace))
		}
	}
}

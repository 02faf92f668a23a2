package simulate

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
)

func simParams() Params {
	return Params{Delta: 30 * time.Second, Restart: 5 * time.Minute, Upload: time.Minute,
		Duration: 30 * 24 * time.Hour, Min: time.Minute, Max: 2 * time.Hour, PriorRate: 0.05}
}

func TestSimulate_Reproducible(t *testing.T) {
	sc := SynthConfig{Rate: 0.05, Duration: 30 * 24 * time.Hour, NoticeSuccess: 0.5, Lead: 2 * time.Minute, Seed: 7}
	a, b := SyntheticTrace(sc), SyntheticTrace(sc)
	if len(a) == 0 {
		t.Fatal("empty trace at 0.05/h over 30 days")
	}
	for _, pol := range []Policy{{Name: "adaptive"}, {Name: "fixed:15m", Fixed: 15 * time.Minute}} {
		ra, rb := Simulate(a, pol, simParams()), Simulate(b, pol, simParams())
		if ra != rb {
			t.Fatalf("%s: same seed, %+v != %+v", pol.Name, ra, rb)
		}
	}
	sc.Seed = 8
	if c := SyntheticTrace(sc); len(c) == len(a) && c[0] == a[0] {
		t.Fatal("seed 8 gave seed 7's trace")
	}
}

func TestSimulate_NoInterruptions(t *testing.T) {
	p := simParams()
	for _, pol := range []Policy{{Name: "adaptive"}, {Name: "fixed:10m", Fixed: 10 * time.Minute}} {
		r := Simulate(SyntheticTrace(SynthConfig{Rate: 0, Duration: p.Duration, Seed: 1}), pol, p)
		if r.Lost != 0 || r.Restart != 0 || r.Interruptions != 0 {
			t.Fatalf("%s: rate 0 gave %+v", pol.Name, r)
		}
		if r.Checkpoints == 0 || r.Useful+r.Overhead != p.Duration {
			t.Fatalf("%s: useful %v + overhead %v != %v (%d checkpoints)", pol.Name, r.Useful, r.Overhead, p.Duration, r.Checkpoints)
		}
	}
}

func TestSimulate_Accounting(t *testing.T) {
	// fixed 10m, δ = 10s, no upload: checkpoints block 10m–10m10s and
	// 20m10s–20m20s; an unannounced loss at 25m loses 4m40s of work.
	p := Params{Delta: 10 * time.Second, Restart: 5 * time.Minute, Duration: time.Hour, Min: time.Minute, Max: 2 * time.Hour}
	tr := []Event{{At: 25 * time.Minute, Kind: Unannounced}}
	r := Simulate(tr, Policy{Fixed: 10 * time.Minute}, p)
	if got, want := r.Lost, 4*time.Minute+40*time.Second; got != want {
		t.Fatalf("lost=%v, want %v", got, want)
	}
	if got, want := r.Restart, 5*time.Minute; got != want {
		t.Fatalf("restart=%v, want %v", got, want)
	}
	if sum := r.Useful + r.Overhead + r.Lost + r.Restart; sum != p.Duration {
		t.Fatalf("useful+overhead+lost+restart=%v, want %v", sum, p.Duration)
	}

	// The same loss announced 2m ahead: the notice checkpoint keeps
	// everything; the trainer then waits for the end (counted as restart).
	tr = []Event{{At: 25 * time.Minute, Kind: Announced, Lead: 2 * time.Minute}}
	r = Simulate(tr, Policy{Fixed: 10 * time.Minute}, p)
	if r.Lost != 0 {
		t.Fatalf("announced: lost=%v, want 0", r.Lost)
	}
	if got, want := r.Restart, 2*time.Minute-10*time.Second+5*time.Minute; got != want {
		t.Fatalf("announced: restart=%v, want %v", got, want)
	}
	// A notice too short for δ + upload commits nothing: lost as unannounced.
	p.Upload = 5 * time.Minute
	r = Simulate(tr, Policy{Fixed: 10 * time.Minute}, p)
	if r.Lost == 0 {
		t.Fatal("short notice: lost=0, want the work since the last upload")
	}
}

func TestSimulate_AdaptiveUsesSignals(t *testing.T) {
	p := simParams()
	p.Duration = 24 * time.Hour
	quiet := Simulate(nil, Policy{Name: "adaptive"}, p)
	var tr []Event
	for h := time.Duration(1); h < 24; h += 2 {
		tr = append(tr, Event{At: h * time.Hour, Kind: Rebalance})
	}
	raised := Simulate(tr, Policy{Name: "adaptive"}, p)
	if raised.Checkpoints <= quiet.Checkpoints {
		t.Fatalf("rebalances: %d checkpoints, without: %d; want more", raised.Checkpoints, quiet.Checkpoints)
	}
	fixed := Simulate(tr, Policy{Fixed: 15 * time.Minute}, p)
	if fixed2 := Simulate(nil, Policy{Fixed: 15 * time.Minute}, p); fixed != fixed2 {
		t.Fatalf("fixed policy reacted to rebalances: %+v vs %+v", fixed, fixed2)
	}
}

func TestSimulate_AdaptiveLearnsNotices(t *testing.T) {
	// Every interruption announced and committed: the adaptive policy
	// learns p → 1 from the journal and checkpoints less often than when
	// every interruption is unannounced.
	p := simParams()
	sc := SynthConfig{Rate: 0.1, Duration: p.Duration, Lead: 3 * time.Minute, Seed: 3}
	none := Simulate(SyntheticTrace(sc), Policy{Name: "adaptive"}, p)
	sc.NoticeSuccess = 1
	all := Simulate(SyntheticTrace(sc), Policy{Name: "adaptive"}, p)
	if all.Checkpoints >= none.Checkpoints/2 || all.Lost != 0 {
		t.Fatalf("notices commit: %d checkpoints, lost %v; never: %d checkpoints", all.Checkpoints, all.Lost, none.Checkpoints)
	}
}

// readTestTrace reads the trace file at path.
func readTestTrace(t *testing.T, path string) []Event {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	evs, err := ReadTrace(f)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

func TestReadTrace(t *testing.T) {
	t.Run("Seconds", func(t *testing.T) {
		evs := readTestTrace(t, "testdata/trace_small.csv")
		if got, want := len(evs), 4; got != want {
			t.Fatalf("%d events, want %d", got, want)
		}
		if e := evs[1]; e.At != 90*time.Minute || e.Kind != Announced || e.Lead != 2*time.Minute {
			t.Fatalf("event 1 = %+v", e)
		}
		r := Simulate(evs, Policy{Fixed: 30 * time.Minute}, simParams())
		if r.Interruptions != 3 || r.Lost == 0 {
			t.Fatalf("replay: %+v, want 3 interruptions and some lost work", r)
		}
	})
	t.Run("RFC3339", func(t *testing.T) {
		evs := readTestTrace(t, "testdata/trace_rfc3339.csv")
		if len(evs) != 3 || evs[0].At != 0 || evs[1].At != time.Hour || evs[2].At != 150*time.Minute {
			t.Fatalf("events %+v, want at 0, 1h, 2h30m", evs)
		}
	})
	t.Run("Errors", func(t *testing.T) {
		for _, in := range []string{"10,crashed,0\n", "yesterday,unannounced,0\n", "10,announced,-1\n", "10\n",
			"10,unannounced\n2025-03-01T10:00:00Z,unannounced\n"} {
			if _, err := ReadTrace(strings.NewReader(in)); err == nil {
				t.Errorf("%q: no error", in)
			}
		}
	})
}

func TestParsePolicies(t *testing.T) {
	ps, err := ParsePolicies("adaptive, fixed:5m,fixed:1h30m")
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 3 || ps[0].Fixed != 0 || ps[2].Fixed != 90*time.Minute || ps[2].Name != "fixed:1h30m" {
		t.Fatalf("policies %+v", ps)
	}
	for _, bad := range []string{"", "fixed:0s", "fixed:soon", "sometimes"} {
		if _, err := ParsePolicies(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestRunGrid_Small(t *testing.T) {
	g := DefaultGrid()
	g.Rates, g.Notices, g.Deltas = []float64{0.05}, []float64{0}, []time.Duration{30 * time.Second}
	g.Runs, g.Duration = 4, 10*24*time.Hour
	cells := RunGrid(g)
	if len(cells) != 1 {
		t.Fatalf("%d cells, want 1", len(cells))
	}
	c := cells[0]
	for i, f := range c.Fixed {
		if f.Waste() < c.Best.Waste() {
			t.Fatalf("fixed %v waste %.3f below best fixed %.3f", g.Fixed[i], f.Waste(), c.Best.Waste())
		}
	}
	if c.Searched < 10 || c.BestInterval < g.Min || c.BestInterval > g.Max {
		t.Fatalf("best %v after %d intervals", c.BestInterval, c.Searched)
	}
	g.Workers = 1
	var calls []int // progress after each cell, counting to the total
	g.Progress = func(done, total int) { calls = append(calls, done, total) }
	if again := RunGrid(g); len(calls) != 2 || calls[0] != 1 || calls[1] != 1 {
		t.Fatalf("progress calls %v, want [1 1]", calls)
	} else if again[0].Adaptive != c.Adaptive || again[0].BestInterval != c.BestInterval {
		t.Fatal("grid depends on the number of workers")
	}
	var b strings.Builder
	if err := WriteGrid(&b, g, cells); err != nil || !strings.Contains(b.String(), "| 5.0 %/h | 0 % | 30s |") {
		t.Fatalf("table %q, err %v", b.String(), err)
	}
}

func TestSummarize(t *testing.T) {
	mk := func(useful time.Duration, lost ...time.Duration) []Result {
		var rs []Result
		for _, l := range lost {
			rs = append(rs, Result{Useful: useful, Lost: l})
		}
		return rs
	}
	h := 100 * time.Hour
	cells := []GridCell{
		{Adaptive: mk(h, time.Hour)[0], Best: mk(h, time.Hour)[0], Fixed: mk(h, 2*time.Hour, time.Hour)},
		{Adaptive: mk(h, 2*time.Hour)[0], Best: mk(h, time.Hour)[0], Fixed: mk(h, 3*time.Hour, time.Hour)},
	}
	s := summarize(cells)
	if s.CellsOver != 1 || s.WorstRatio != 2 || s.AdaptiveSum != 3 || s.BeatsAllFixed {
		t.Fatalf("summary %+v", s)
	}
}

func TestRunGrid_NoticesNearlyAlwaysCommit(t *testing.T) {
	// The cell that missed issue 6's target by most (1.33 × best fixed with
	// plug-in posterior means): 0.8 %/h, every notice commits, δ = 5 s. The
	// relative-regret interval must stay within 1.1 × best fixed, and not
	// give it back in the cell that pulls the other way (no notice commits).
	if testing.Short() {
		t.Skip("simulates 2 × 60 runs of 30 days")
	}
	g := DefaultGrid()
	g.Rates, g.Deltas, g.Notices = []float64{0.008}, []time.Duration{5 * time.Second}, []float64{1, 0}
	g.Fixed, g.Runs = []time.Duration{time.Hour}, 60
	for _, c := range RunGrid(g) {
		if r := c.Ratio(); r > 1.1 {
			t.Errorf("notice %.0f %%: adaptive %.3f, best fixed %.3f @ %v: ratio %.3f > 1.1",
				100*c.Notice, c.Adaptive.Waste(), c.Best.Waste(), c.BestInterval, r)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// twoInterruptions (a copy of pkg/checkpoint/journal's) is a journal as the agent writes it: three sessions,
// the first ended by a notice whose checkpoint committed, the second by an
// interruption that lost 10 minutes of work; sessions 2 and 3 restored.
func twoInterruptions() *journal.Journal {
	t := time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t.Add(d) }
	return &journal.Journal{
		Format: journal.Format, RunID: "r",
		Sessions: []journal.Session{
			{Start: at(0), End: ptr(at(2*time.Hour + 2*time.Minute)), BlockedSeconds: ptr(60.0)},
			{Start: at(2*time.Hour + 7*time.Minute), End: ptr(at(5 * time.Hour)), BlockedSeconds: ptr(45.0)},
			{Start: at(5*time.Hour + 4*time.Minute), End: ptr(at(8 * time.Hour)), BlockedSeconds: ptr(30.0)},
		},
		Interruptions: []journal.Interruption{
			{Detected: at(2 * time.Hour), Done: ptr(at(2*time.Hour + 20*time.Second)),
				Committed: ptr(at(2*time.Hour + 50*time.Second)), CommitOK: true},
			{Detected: at(4*time.Hour + 59*time.Minute), Loss: journal.Loss{LostSeconds: 600}, Error: "deadline passed"},
		},
		Restores: []journal.RestoreEntry{
			{At: at(2*time.Hour + 7*time.Minute), Seconds: 40},
			{At: at(5*time.Hour + 4*time.Minute), Seconds: 35},
		},
	}
}

func TestTraceFromJournal(t *testing.T) {
	j := twoInterruptions()
	j.Interruptions[0].Deadline = ptr(j.Interruptions[0].Detected.Add(2 * time.Minute))
	evs, wall, err := TraceFromJournal(j)
	if err != nil {
		t.Fatal(err)
	}
	if wall != 8*time.Hour || len(evs) != 2 {
		t.Fatalf("wall %v, %d events", wall, len(evs))
	}
	if e := evs[0]; e.Kind != Announced || e.Lead != 2*time.Minute || e.At != 2*time.Hour+2*time.Minute {
		t.Fatalf("first %+v, want announced 2m ahead of 2h2m", e)
	}
	if e := evs[1]; e.Kind != Unannounced || e.At != 4*time.Hour+59*time.Minute {
		t.Fatalf("second %+v, want unannounced at 4h59m", e)
	}
}

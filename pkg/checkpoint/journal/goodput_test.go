package journal

import (
	"strings"
	"testing"
	"time"
)

func ptr[T any](v T) *T { return &v }

// twoInterruptions is a journal as the agent writes it: three sessions,
// the first ended by a notice whose checkpoint committed, the second by an
// interruption that lost 10 minutes of work; sessions 2 and 3 restored.
func twoInterruptions() *Journal {
	t := time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t.Add(d) }
	return &Journal{
		Format: Format, RunID: "r",
		Sessions: []Session{
			{Start: at(0), End: ptr(at(2*time.Hour + 2*time.Minute)), BlockedSeconds: ptr(60.0)},
			{Start: at(2*time.Hour + 7*time.Minute), End: ptr(at(5 * time.Hour)), BlockedSeconds: ptr(45.0)},
			{Start: at(5*time.Hour + 4*time.Minute), End: ptr(at(8 * time.Hour)), BlockedSeconds: ptr(30.0)},
		},
		Interruptions: []Interruption{
			{Detected: at(2 * time.Hour), Done: ptr(at(2*time.Hour + 20*time.Second)),
				Committed: ptr(at(2*time.Hour + 50*time.Second)), CommitOK: true},
			{Detected: at(4*time.Hour + 59*time.Minute), Loss: Loss{LostSeconds: 600}, Error: "deadline passed"},
		},
		Restores: []RestoreEntry{
			{At: at(2*time.Hour + 7*time.Minute), Seconds: 40},
			{At: at(5*time.Hour + 4*time.Minute), Seconds: 35},
		},
	}
}

func TestAccount_TwoInterruptionsAndRestores(t *testing.T) {
	j := twoInterruptions()
	g, err := Account(j, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	wall := 8 * time.Hour
	if got := g.Wall; got != wall.Seconds() {
		t.Fatalf("wall=%v, want %v", got, wall.Seconds())
	}
	var sum float64
	for _, b := range Buckets {
		sum += g.Seconds[b]
	}
	if d := sum - wall.Seconds(); d > 0.01*wall.Seconds() || d < -0.01*wall.Seconds() {
		t.Fatalf("buckets sum to %v, wall %v", sum, wall.Seconds())
	}
	want := map[string]float64{
		BucketBlocked: 135, BucketLost: 600, BucketRestore: 75,
		// 70 s after the committed notice + 5 m gap; 1 m after the loss + 4 m gap.
		BucketBetween: 70 + 300 + 60 + 240,
	}
	want[BucketProductive] = wall.Seconds() - 135 - 600 - 75 - want[BucketBetween]
	for b, w := range want {
		if got := g.Seconds[b]; got < w-0.001 || got > w+0.001 {
			t.Errorf("%s=%v, want %v", b, got, w)
		}
	}
	if g.Interruptions != 2 || g.NoticeCommits != 1 || len(g.Missing) != 0 {
		t.Fatalf("interruptions %d, notice commits %d, missing %q", g.Interruptions, g.NoticeCommits, g.Missing)
	}
	if s := g.Sessions[1]; !s.Interrupted || s.NoticeOK || s.Seconds[BucketLost] != 600 {
		t.Fatalf("session 2: %+v", s)
	}
	m := g.Cost(2, 6)
	machine := (wall - 9*time.Minute).Hours()
	if got, want := m.Spend, 2*machine; got < want-1e-9 || got > want+1e-9 {
		t.Fatalf("spend=%v, want %v", got, want)
	}
	if wasted := 2 * (600 + 75 + 70 + 60) / 3600.0; m.Wasted < wasted-1e-9 || m.Wasted > wasted+1e-9 {
		t.Fatalf("wasted=%v, want %v", m.Wasted, wasted)
	}
	if m.Saving <= 0 || m.OnDemand <= m.Spend {
		t.Fatalf("on demand %v, spend %v: want a saving", m.OnDemand, m.Spend)
	}
}

func TestAccount_NoInterruptions(t *testing.T) {
	t0 := time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC)
	j := &Journal{Sessions: []Session{{Start: t0, End: ptr(t0.Add(time.Hour)), BlockedSeconds: ptr(36.0)}}}
	g, err := Account(j, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if g.Interruptions != 0 || g.Ratio < 0.989 || g.Ratio > 0.991 {
		t.Fatalf("interruptions %d, ratio %v, want 0 and 0.99", g.Interruptions, g.Ratio)
	}
}

// TestAccount_FailedUnkept: a trainer that crashed in a run that never
// committed a checkpoint trained nothing that was kept: lost, not
// productive; once a checkpoint committed, or with exit 75, it stays
// productive.
func TestAccount_FailedUnkept(t *testing.T) {
	t0 := time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		code        int
		checkpoints int
		productive  float64
	}{{1, 0, 0}, {137, 0, 0}, {1, 1, 3}, {75, 0, 3}, {0, 0, 3}} {
		j := &Journal{Sessions: []Session{{Start: t0, End: ptr(t0.Add(3 * time.Second)), ExitCode: ptr(c.code), BlockedSeconds: ptr(0.0)}}}
		j.Stats.Checkpoints = c.checkpoints
		g, err := Account(j, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if got := g.Seconds[BucketProductive]; got != c.productive || g.Seconds[BucketLost] != 3-c.productive {
			t.Errorf("exit %d, %d checkpoint(s): productive %v, lost %v; want %v and %v", c.code, c.checkpoints, got, g.Seconds[BucketLost], c.productive, 3-c.productive)
		}
	}
}

func TestAccount_PartialJournal(t *testing.T) {
	j := twoInterruptions()
	j.Sessions[1].End = nil            // its agent died
	j.Sessions[2].BlockedSeconds = nil // an older agent
	g, err := Account(j, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(g.Missing, "\n")
	for _, w := range []string{"session 2 has no end", "session 3 has no blocked_seconds"} {
		if !strings.Contains(all, w) {
			t.Errorf("missing %q, want it to name %q", all, w)
		}
	}
	// The rest of the report stands: same wall, both interruptions.
	if g.Wall != 8*3600 || g.Interruptions != 2 || len(g.Sessions) != 3 {
		t.Fatalf("wall %v, interruptions %d, sessions %d", g.Wall, g.Interruptions, len(g.Sessions))
	}
	var sum float64
	for _, b := range Buckets {
		sum += g.Seconds[b]
	}
	if sum < g.Wall*0.99 || sum > g.Wall*1.01 {
		t.Fatalf("buckets %v, wall %v", sum, g.Wall)
	}
	if _, err := Account(&Journal{}, time.Now()); err == nil || !strings.Contains(err.Error(), "no sessions") {
		t.Fatalf("empty journal: err=%v, want one naming the sessions", err)
	}
}

// TestAccount_GapAfterFinishedIsNoTime: the time between a session that
// finished (its trainer's work done) and a later start (the run extended)
// is no time of the run's: not between machines, not in its wall, not
// paid; after an interrupted session the same gap is between machines.
// Both counted it as between (a new user's trial: goodput 23.7 % for a
// run rerun 13 s after it finished; a week later it reads near 0 %).
func TestAccount_GapAfterFinishedIsNoTime(t *testing.T) {
	t0 := time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	for _, c := range []struct {
		name        string
		finished    bool
		wantBetween float64
	}{{"finished", true, 0}, {"interrupted", false, 7 * 24 * 3600}} {
		t.Run(c.name, func(t *testing.T) {
			j := &Journal{Sessions: []Session{
				{Start: at(0), End: ptr(at(time.Hour)), BlockedSeconds: ptr(0.0), Finished: c.finished},
				{Start: at(time.Hour + 7*24*time.Hour), End: ptr(at(2*time.Hour + 7*24*time.Hour)), BlockedSeconds: ptr(0.0)},
			}}
			g, err := Account(j, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			wantWall := 2*3600 + c.wantBetween
			if g.Wall != wantWall || g.Seconds[BucketBetween] != c.wantBetween || g.Seconds[BucketProductive] != 2*3600 {
				t.Fatalf("wall %v, between %v, productive %v: want %v, %v, 7200", g.Wall, g.Seconds[BucketBetween], g.Seconds[BucketProductive], wantWall, c.wantBetween)
			}
			if s := g.Sessions[1]; s.Wall != 3600+c.wantBetween {
				t.Fatalf("session 2's wall %v, want %v", s.Wall, 3600+c.wantBetween)
			}
			if m := g.Cost(1, 0); m.Spend != 2 || m.Wasted != 0 {
				t.Fatalf("spend %v, wasted %v: want the two sessions' 2 h paid, nothing wasted (nobody pays between machines)", m.Spend, m.Wasted)
			}
		})
	}
}

package simulate

import (
	"math"
	"testing"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint/journal"
)

// adviceJournal is a run of three sessions of h hours each, ended by two
// notices (committed or not per ok), with δ = 20 s per checkpoint.
func adviceJournal(h time.Duration, ok ...bool) *journal.Journal {
	t0 := time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC)
	j := &journal.Journal{RunID: "r"}
	at := t0
	for i := 0; i <= len(ok); i++ {
		end := at.Add(h)
		blocked := 20.0 * 10
		j.Sessions = append(j.Sessions, journal.Session{Start: at, End: &end, BlockedSeconds: &blocked})
		if i > 0 {
			j.Restores = append(j.Restores, journal.RestoreEntry{At: at.Add(time.Second), Seconds: 30})
		}
		if i < len(ok) {
			det := end.Add(-2 * time.Minute)
			dl, done, com := end, det.Add(20*time.Second), det.Add(30*time.Second)
			in := journal.Interruption{Detected: det, Deadline: &dl, CommitOK: ok[i], Bytes: 100e6}
			if ok[i] {
				in.Done, in.Committed = &done, &com
			} else {
				in.LostSeconds = 600
			}
			j.Interruptions = append(j.Interruptions, in)
		}
		at = end.Add(3 * time.Minute)
	}
	j.Stats = journal.Stats{Checkpoints: 30, CostSeconds: 20, BytesPerSec: 10e6, LastBytes: 100e6,
		RunSeconds: 3 * h.Seconds()}
	return j
}

func TestAdvise_Calibration(t *testing.T) {
	j := adviceJournal(10*time.Hour, true, true)
	g, err := journal.Account(j, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	a := Advise(j, g, AdviceConfig{Runs: 50, Current: 15 * time.Minute})
	c := a.Calibration
	if c.Interruptions != 2 || c.NoticeCommitted != 2 || math.Abs(c.RunHours-30) > 1e-9 {
		t.Fatalf("calibration %+v", c)
	}
	if math.Abs(c.DeltaSeconds-20) > 1e-9 || math.Abs(c.UploadSeconds-10) > 1e-9 {
		t.Fatalf("δ %v s, upload %v s: want 20, 10", c.DeltaSeconds, c.UploadSeconds)
	}
	// Restart: deadline → next start (3 min) + restore (30 s).
	if math.Abs(c.RestartSeconds-210) > 1e-9 {
		t.Fatalf("restart %v s, want 210", c.RestartSeconds)
	}
	if want := (0.05*24 + 2) / (24 + 30); math.Abs(c.Rate-want) > 1e-12 {
		t.Fatalf("rate %v, want %v", c.Rate, want)
	}
	if a.CurrentWaste < a.Waste {
		t.Fatalf("recommended %s predicts %.3f %%, more than the current 15m's %.3f %%", a.Recommended, a.Waste, a.CurrentWaste)
	}
	var cur int
	for _, p := range a.Policies {
		if p.Current {
			cur++
			if p.Policy != "fixed:15m" {
				t.Fatalf("current policy %s, want fixed:15m", p.Policy)
			}
		}
	}
	if cur != 1 {
		t.Fatalf("%d current policies", cur)
	}
	// Margin: the uploads took 10 s, as estimated (100 MB at 10 MB/s).
	if a.Margin.Notices != 2 || a.Margin.Recommended != 5 || a.Margin.MaxOverrun != 0 || a.Margin.MinLead != 120 {
		t.Fatalf("margin %+v", a.Margin)
	}
}

// Committed notices and lost work count differently: after two
// interruptions that lost work the advice predicts more waste and a
// shorter best fixed interval than after two whose notice committed.
func TestAdvise_CommittedVersusLost(t *testing.T) {
	best := func(a *Advice) float64 {
		b := a.Policies[0]
		for _, p := range a.Policies[1:] {
			if p.Waste < b.Waste || b.Interval == 0 {
				b = p
			}
		}
		return b.Interval
	}
	var ivs [2]float64
	var p [2]float64
	for i, ok := range []bool{true, false} {
		j := adviceJournal(5*time.Hour, ok, ok)
		g, err := journal.Account(j, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		a := Advise(j, g, AdviceConfig{Runs: 100})
		ivs[i], p[i] = best(a), a.Calibration.NoticeSuccess
	}
	if p[0] < 0.8 || p[1] > 0.2 {
		t.Fatalf("posterior notice success %.2f after two commits, %.2f after two losses", p[0], p[1])
	}
	if ivs[1] >= ivs[0] {
		t.Fatalf("best fixed interval %v s after losses, %v s after commits: want shorter after losses", ivs[1], ivs[0])
	}
}

func TestAdvise_MarginOverrun(t *testing.T) {
	j := adviceJournal(time.Hour, true)
	j.Stats.BytesPerSec = 20e6 // estimate 5 s; the upload took 10 s
	a := Advise(j, nil, AdviceConfig{Runs: 2})
	if a.Margin.MaxOverrun != 5 || a.Margin.Recommended != 10 {
		t.Fatalf("margin %+v, want overrun 5 s, recommended 10 s", a.Margin)
	}
	j.Interruptions = nil
	if a := Advise(j, nil, AdviceConfig{Runs: 2}); !a.Margin.Unavailable || a.Margin.Recommended != 5 {
		t.Fatalf("margin without notices %+v", a.Margin)
	}
}

// The advice's draws are pinned: the predicted waste of each policy for a
// fixed seed, as computed before the notice-success model moved to
// internal/beta. A change of the model or of the order of the draws shows
// here (the tolerance only absorbs fused multiply-adds on other CPUs).
func TestAdvise_Pinned(t *testing.T) {
	a := Advise(adviceJournal(5*time.Hour, true, false), nil, AdviceConfig{Runs: 20})
	want := []struct {
		policy string
		waste  float64
	}{
		{"adaptive", 2.900813674821087},
		{"fixed:5m", 7.589356353394499},
		{"fixed:10m", 4.38776129359729},
		{"fixed:15m", 3.4891292106081364},
		{"fixed:30m", 2.845792517605905},
		{"fixed:31m", 2.8897294437111474},
		{"fixed:1h", 3.156009333030165},
		{"fixed:2h", 4.655334814625485},
	}
	if got, want := len(a.Policies), len(want); got != want {
		t.Fatalf("%d policies, want %d: %+v", got, want, a.Policies)
	}
	for i, w := range want {
		p := a.Policies[i]
		if p.Policy != w.policy || math.Abs(p.Waste-w.waste) > 1e-9*w.waste {
			t.Errorf("policy %d: %s %v, want %s %v", i, p.Policy, p.Waste, w.policy, w.waste)
		}
	}
}

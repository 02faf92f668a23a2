package schedule

import (
	"math"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

func TestDalyInterval(t *testing.T) {
	// Daly 2006, figs. 3–5: δ = 5 min and M = 24 h, 6 h, 15 min give
	// τopt = 117, 57 and 9.1 min (compute time, δ excluded).
	for _, tc := range []struct {
		m    time.Duration
		want float64 // minutes, computed
	}{
		{24 * time.Hour, 116.690},
		{6 * time.Hour, 56.713},
		{15 * time.Minute, 9.142},
	} {
		got := DalyInterval(5*time.Minute, tc.m).Minutes()
		if math.Abs(got-tc.want) > 0.01 {
			t.Errorf("DalyInterval(5m, %v)=%.3f min, want %.3f", tc.m, got, tc.want)
		}
	}
	// Young's first order √(2δM) is 120 min for the worked example; Daly's
	// correction subtracts δ and adds a little back.
	if young := math.Sqrt(2 * 5 * 24 * 60); young != 120 {
		t.Fatalf("young=%v", young)
	}
	if got, want := DalyInterval(5*time.Minute, 2*time.Minute), 2*time.Minute; got != want {
		t.Errorf("δ ≥ 2M: got %v, want M=%v", got, want)
	}
	if got := DalyInterval(5*time.Minute, 0); got != 0 {
		t.Errorf("M=0: got %v, want 0", got)
	}
}

// intervalFor returns the interval of a fresh adaptive scheduler with cost
// delta and history h.
func intervalFor(cfg SchedulerConfig, delta time.Duration, h History) time.Duration {
	s := NewScheduler(cfg)
	s.ObserveHistory(h)
	s.ObserveCost(delta)
	s.Next(t0, false, t0)
	return s.Interval()
}

func TestScheduler_Formula(t *testing.T) {
	// A long history narrows the posterior: the interval is Daly's for the
	// plug-in M = 1/(λ·(1−p)). λ = (0.05·24 + 500)/(24 + 10000) ≈ 0.05/h,
	// p ≈ ½: M ≈ 40 h.
	h := History{RunTime: 10000 * time.Hour, Interruptions: 500, NoticeCommitted: 250}
	got := intervalFor(SchedulerConfig{}, 30*time.Second, h)
	lam := (0.05*24 + 500) / (24 + 10000.0)
	want := DalyInterval(30*time.Second, time.Duration(float64(time.Hour)/(lam*(1-noticeMean(250, 250)))))
	if r := got.Seconds() / want.Seconds(); r < 0.97 || r > 1.03 {
		t.Fatalf("interval=%v, want ≈ %v (plug-in)", got, want)
	}
	// With only the prior, worlds where notices commit weigh more: the
	// interval is longer than the plug-in one (M = 1/(0.05·½) = 40 h), but
	// within the clamp.
	got = intervalFor(SchedulerConfig{}, 30*time.Second, History{})
	if plug := DalyInterval(30*time.Second, 40*time.Hour); got <= plug || got >= DefaultMaxInterval {
		t.Fatalf("prior interval=%v, want in (%v, %v)", got, plug, DefaultMaxInterval)
	}
}

func TestNoticeMean(t *testing.T) {
	for _, c := range []struct {
		committed, lost int
		lo, hi          float64
	}{
		{0, 0, 0.5, 0.5},
		{1, 0, 0.84, 0.86}, // Jeffreys: 0.75
		{0, 1, 0.14, 0.16},
		{9, 1, 0.85, 0.9},
		{100, 0, 0.99, 1},
	} {
		if got := noticeMean(c.committed, c.lost); got < c.lo || got > c.hi {
			t.Errorf("noticeMean(%d, %d)=%.3f, want in [%.2f, %.2f]", c.committed, c.lost, got, c.lo, c.hi)
		}
	}
}

func TestScheduler_Clamps(t *testing.T) {
	t.Run("Min", func(t *testing.T) {
		got := intervalFor(SchedulerConfig{InterruptionRate: 50, Min: 3 * time.Minute}, time.Second, History{})
		if want := 3 * time.Minute; got != want {
			t.Fatalf("interval=%v, want %v", got, want)
		}
	})
	t.Run("Max", func(t *testing.T) {
		got := intervalFor(SchedulerConfig{InterruptionRate: 0.0001, Max: 90 * time.Minute}, 2*time.Minute, History{})
		if want := 90 * time.Minute; got != want {
			t.Fatalf("interval=%v, want %v", got, want)
		}
	})
	t.Run("Defaults", func(t *testing.T) {
		if got, want := intervalFor(SchedulerConfig{InterruptionRate: 1e-6}, time.Minute, History{}), DefaultMaxInterval; got != want {
			t.Fatalf("interval=%v, want %v", got, want)
		}
		if got, want := intervalFor(SchedulerConfig{InterruptionRate: 1e3}, time.Second, History{}), DefaultMinInterval; got != want {
			t.Fatalf("interval=%v, want %v", got, want)
		}
	})
}

func TestScheduler_NoticeFraction(t *testing.T) {
	cfg := SchedulerConfig{Max: 100 * time.Hour}
	none := intervalFor(cfg, 10*time.Second, History{RunTime: 200 * time.Hour, Interruptions: 10, NoticeCommitted: 0})
	most := intervalFor(cfg, 10*time.Second, History{RunTime: 200 * time.Hour, Interruptions: 10, NoticeCommitted: 9})
	all := intervalFor(cfg, 10*time.Second, History{RunTime: 200 * time.Hour, Interruptions: 10, NoticeCommitted: 10})
	if !(none < most && most < all) {
		t.Fatalf("intervals p=0: %v, p=0.9: %v, p=1: %v; want increasing", none, most, all)
	}
	// M ∝ 1/(1−p): 1−p̂ ≈ 0.95 vs ≈ 0.14 is a factor 7 in M, ≈ √7 in τ,
	// and the relative-regret weighting lengthens the second a little more.
	if r := most.Seconds() / none.Seconds(); r < 2.5 || r > 4.5 {
		t.Fatalf("ratio=%.2f, want ≈ √7 or a little more", r)
	}
}

func TestScheduler_LearnsRate(t *testing.T) {
	// 500 h without an interruption: the rate falls from the 0.05/h prior.
	prior := intervalFor(SchedulerConfig{}, 10*time.Second, History{})
	quiet := intervalFor(SchedulerConfig{}, 10*time.Second, History{RunTime: 500 * time.Hour})
	busy := intervalFor(SchedulerConfig{}, 10*time.Second, History{RunTime: 50 * time.Hour, Interruptions: 20})
	if !(busy < prior && prior < quiet) {
		t.Fatalf("busy %v, prior %v, quiet %v: want increasing", busy, prior, quiet)
	}
	// This life's time without interruption counts too, in whole hours.
	s := NewScheduler(SchedulerConfig{})
	s.ObserveCost(10 * time.Second)
	s.Next(t0, false, t0)
	s.Next(t0, false, t0.Add(59*time.Minute))
	if got := s.Interval(); got != prior {
		t.Fatalf("after 59m: %v, want unchanged %v", got, prior)
	}
	s.Next(t0, false, t0.Add(500*time.Hour))
	if got := s.Interval(); got != quiet {
		t.Fatalf("after 500h of this life: %v, want %v as from the journal", got, quiet)
	}
}

func TestScheduler_Rebalance(t *testing.T) {
	s := NewScheduler(SchedulerConfig{})
	s.ObserveCost(30 * time.Second)
	s.Next(t0, false, t0)
	before := s.Interval()
	s.Hazard(t0, "rebalance", time.Time{})
	at := s.Interval()
	// λ ×10 at once: τ shrinks by up to √10 (less: before it, the worlds
	// whose best interval is past the 2 h clamp weigh more).
	if r := before.Seconds() / at.Seconds(); r < 2.2 || r > 3.4 {
		t.Fatalf("before %v, after rebalance %v (ratio %.2f), want ≈ √10", before, at, r)
	}
	if due := s.Next(t0, false, t0); due != t0.Add(at) {
		t.Fatalf("Next=%v, want last+%v", due, at)
	}
	s.Next(t0, false, t0.Add(2*time.Hour))
	mid := s.Interval()
	// Decays back: after 24 h the factor is 1 + 9e^-12 (exposure counts the
	// day too, so compare with a scheduler that had no signal).
	s.Next(t0, false, t0.Add(24*time.Hour))
	late := s.Interval()
	ref := NewScheduler(SchedulerConfig{})
	ref.ObserveCost(30 * time.Second)
	ref.Next(t0, false, t0)
	ref.Next(t0, false, t0.Add(24*time.Hour))
	if !(at < mid && mid < late) || late != ref.Interval() {
		t.Fatalf("at %v, 2h %v, 24h %v, want increasing to %v", at, mid, late, ref.Interval())
	}

	t.Run("Until", func(t *testing.T) {
		s := NewScheduler(SchedulerConfig{})
		s.ObserveCost(30 * time.Second)
		s.Next(t0, false, t0)
		before := s.Interval()
		s.Hazard(t0, "rebalance", t0.Add(30*time.Minute))
		s.Next(t0, false, t0.Add(29*time.Minute))
		if got := s.Interval(); got >= before {
			t.Fatalf("during: %v, want < %v", got, before)
		}
		s.Next(t0, false, t0.Add(31*time.Minute))
		if got := s.Interval(); got != before {
			t.Fatalf("after until: %v, want %v", got, before)
		}
	})
}

func TestScheduler_Maintenance(t *testing.T) {
	s := NewScheduler(SchedulerConfig{})
	s.ObserveCost(20 * time.Second)
	s.ObserveUpload(40*time.Second, 2e9)
	s.Next(t0, false, t0)
	iv := s.Interval()
	maint := t0.Add(iv / 2)
	s.Hazard(t0.Add(time.Minute), "maintenance", maint)
	if got, want := s.Next(t0, false, t0.Add(time.Minute)), maint.Add(-time.Minute); got != want {
		t.Fatalf("Next=%v, want %v (δ + upload before the event)", got, want)
	}
	// A checkpoint after that point: back to the normal interval.
	last := maint.Add(-30 * time.Second)
	if got, want := s.Next(last, false, last), last.Add(iv); got != want {
		t.Fatalf("after the pre-maintenance checkpoint Next=%v, want %v", got, want)
	}
	s.Hazard(t0.Add(2*time.Minute), "cancelled", time.Time{})
	if got, want := s.Next(t0, false, t0.Add(2*time.Minute)), t0.Add(iv); got != want {
		t.Fatalf("cancelled: Next=%v, want %v", got, want)
	}
}

func TestScheduler_SlowUpload(t *testing.T) {
	s := NewScheduler(SchedulerConfig{InterruptionRate: 1})
	s.ObserveCost(5 * time.Second)
	s.ObserveUpload(40*time.Minute, 12e9) // 5 MB/s
	s.Next(t0, false, t0)
	if got := s.Interval(); got < 40*time.Minute {
		t.Fatalf("interval=%v, want ≥ the 40m upload", got)
	}
	if got, want := s.EstimateUpload(6e9), 20*time.Minute; got != want {
		t.Fatalf("EstimateUpload=%v, want %v", got, want)
	}
	now := t0.Add(3 * time.Hour)
	due := s.Next(t0, true, now)
	if !due.After(now) {
		t.Fatalf("uploading: Next=%v, want after now %v", due, now)
	}
	if s.Due(now, t0, true) {
		t.Fatal("Due while uploading")
	}
	if !s.Due(now, t0, false) {
		t.Fatal("not Due once the upload finished")
	}
}

func TestScheduler_Fixed(t *testing.T) {
	s := NewScheduler(SchedulerConfig{Fixed: 15 * time.Minute, InterruptionRate: 5})
	s.ObserveCost(10 * time.Minute)
	s.ObserveUpload(time.Minute, 1e9)
	s.ObserveHistory(History{RunTime: time.Hour, Interruptions: 30})
	s.Hazard(t0, "rebalance", time.Time{})
	s.Hazard(t0, "maintenance", t0.Add(5*time.Minute))
	if got, want := s.Interval(), 15*time.Minute; got != want {
		t.Fatalf("Interval=%v, want %v", got, want)
	}
	if got, want := s.Next(t0, false, t0), t0.Add(15*time.Minute); got != want {
		t.Fatalf("Next=%v, want %v", got, want)
	}
}

func TestScheduler_Estimates(t *testing.T) {
	s := NewScheduler(SchedulerConfig{})
	if got, want := s.Cost(), DefaultCost; got != want {
		t.Fatalf("Cost=%v, want default %v", got, want)
	}
	if got, want := s.EstimateUpload(100e6), 2*time.Second; got != want {
		t.Fatalf("EstimateUpload=%v, want %v at 50 MB/s", got, want)
	}
	s.ObserveHistory(History{Cost: 40 * time.Second, Throughput: 200e6})
	if got, want := s.Cost(), 40*time.Second; got != want {
		t.Fatalf("Cost from journal=%v, want %v", got, want)
	}
	s.ObserveCost(10 * time.Second) // EWMA, α = 0.3
	if got, want := s.Cost(), 31*time.Second; got != want {
		t.Fatalf("Cost=%v, want %v", got, want)
	}
	if got, want := s.Throughput(), 200e6; got != want {
		t.Fatalf("Throughput=%v, want %v", got, want)
	}
}

func TestScheduler_LogsChanges(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	s := NewScheduler(SchedulerConfig{Log: zap.New(core)})
	s.ObserveCost(30 * time.Second)
	s.Interval()
	s.Interval()
	if got := logs.FilterMessage("checkpoint interval").Len(); got != 1 {
		t.Fatalf("%d interval logs for one value, want 1", got)
	}
	s.Hazard(t0, "rebalance", time.Time{})
	e := logs.FilterMessage("checkpoint interval").All()
	if len(e) != 2 {
		t.Fatalf("%d interval logs after a rebalance, want 2", len(e))
	}
	f := e[1].ContextMap()
	if f["hazard_factor"] != 10.0 || f["cost_s"] != 30.0 || f["rate_per_h"] != 0.05 {
		t.Fatalf("log fields %v", f)
	}
}

// TestScheduler_LogsOnlyMeaningfulChanges: a change under 10 % (each
// commit's cost sample moves the interval by seconds) is logged at debug;
// Quiet (zero-code mode, which never asks) logs every change at debug.
func TestScheduler_LogsOnlyMeaningfulChanges(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	s := NewScheduler(SchedulerConfig{Log: zap.New(core)})
	s.ObserveCost(30 * time.Second)
	first := s.Interval()
	s.ObserveCost(31 * time.Second)
	if s.Interval() == first {
		t.Fatal("a new cost sample left the interval as it was: the test proves nothing")
	}
	e := logs.FilterMessage("checkpoint interval").All()
	if len(e) != 2 || e[0].Level != zapcore.InfoLevel || e[1].Level != zapcore.DebugLevel {
		t.Fatalf("interval logs %v, want one at info then one at debug", e)
	}
	q := NewScheduler(SchedulerConfig{Log: zap.New(core)})
	q.Quiet()
	q.ObserveCost(30 * time.Second)
	q.Interval()
	q.Hazard(t0, "rebalance", time.Time{})
	quiet := logs.FilterMessage("checkpoint interval").All()[2:]
	if len(quiet) != 2 {
		t.Fatalf("%d interval logs from the quiet scheduler, want 2 (at debug)", len(quiet))
	}
	for _, l := range quiet {
		if l.Level != zapcore.DebugLevel {
			t.Fatalf("a quiet scheduler logged %v at %v", l.ContextMap(), l.Level)
		}
	}
}

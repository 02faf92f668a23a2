package watch

import (
	"testing"
	"time"
)

func TestPace(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	t.Run("OneCheckpoint", func(t *testing.T) {
		var p Pace
		p.Add(100, at(0))
		if step, ok := p.At(at(5)); ok {
			t.Fatalf("At=%d with one checkpoint, want no rate", step)
		}
	})
	t.Run("Extrapolates", func(t *testing.T) {
		// 10 steps a second, a save every 10 s; stopped 4.5 s after the last.
		var p Pace
		for _, s := range []int64{100, 200, 300} {
			p.Add(s, at(float64(s)/10))
		}
		if got, ok := p.At(at(34.5)); !ok || got != 345 {
			t.Fatalf("At=%d, %v; want 345", got, ok)
		}
		if got, _ := p.At(at(20)); got != 300 {
			t.Fatalf("At before the newest checkpoint=%d, want 300 (never less than it)", got)
		}
	})
	t.Run("NewestOnly", func(t *testing.T) {
		// The trainer slowed down: the rate follows the newest saves.
		var p Pace
		p.Add(0, at(0))
		for i := int64(1); i <= 10; i++ {
			p.Add(1000+i*10, at(100+float64(i)))
		}
		if got, _ := p.At(at(112)); got != 1120 {
			t.Fatalf("At=%d, want 1120 (10 steps/s, the pace of the newest %d saves)", got, paceSaves)
		}
	})
	t.Run("SameStepTwice", func(t *testing.T) {
		var p Pace
		p.Add(10, at(0))
		p.Add(20, at(1))
		p.Add(20, at(5)) // seen again (retried after a failed upload)
		if got, _ := p.At(at(2)); got != 30 {
			t.Fatalf("At=%d, want 30: a step keeps its first time", got)
		}
	})
	t.Run("Reset", func(t *testing.T) {
		var p Pace
		p.Add(10, at(0))
		p.Add(20, at(1))
		p.Reset()
		p.Add(30, at(2))
		if _, ok := p.At(at(3)); ok {
			t.Fatal("a rate after Reset and one checkpoint")
		}
	})
}

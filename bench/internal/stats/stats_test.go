package stats

import (
	"testing"
	"time"
)

// TestMedianPct: the median of odd and even counts, the nearest-rank
// percentile at its edges, none for no samples, and the input untouched.
func TestMedianPct(t *testing.T) {
	xs := []float64{5, 1, 4, 2, 3}
	if m := Median(xs); m != 3 {
		t.Errorf("Median %v = %v, want 3", xs, m)
	}
	if xs[0] != 5 {
		t.Errorf("Median sorted its input: %v", xs)
	}
	if m := Median([]float64{4, 1, 3, 2}); m != 2.5 {
		t.Errorf("Median of 4 = %v, want 2.5", m)
	}
	if Median(nil) != 0 || Pct(nil, 0.5) != 0 {
		t.Error("no samples: want 0")
	}
	ten := []float64{10, 9, 8, 7, 6, 5, 4, 3, 2, 1}
	for _, c := range []struct{ p, want float64 }{{0, 1}, {0.1, 1}, {0.5, 5}, {0.9, 9}, {0.95, 10}, {1, 10}} {
		if got := Pct(ten, c.p); got != c.want {
			t.Errorf("Pct(1..10, %v) = %v, want %v", c.p, got, c.want)
		}
	}
	if lo, hi := MinMax(xs); lo != 1 || hi != 5 {
		t.Errorf("MinMax = %v, %v; want 1, 5", lo, hi)
	}
}

func TestUnits(t *testing.T) {
	if ms := MS(1500 * time.Microsecond); ms != 1.5 {
		t.Errorf("MS(1.5ms) = %v", ms)
	}
	if r := MBps(3e6, 2*time.Second); r != 1.5 {
		t.Errorf("MBps(3 MB, 2 s) = %v, want 1.5", r)
	}
}

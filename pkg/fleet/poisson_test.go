package fleet

import (
	"math"
	"testing"
)

// Garwood 90 % limits: chi-square quantiles / 2 from tables
// (χ²(0.05; 2) = 0.1026, χ²(0.95; 4) = 9.4877, χ²(0.05; 20) = 10.851,
// χ²(0.95; 22) = 33.924), and −ln(0.05) for k = 0.
func TestRateInterval(t *testing.T) {
	for _, c := range []struct {
		k      int
		t      float64
		lo, hi float64
	}{
		{0, 1, 0, 2.99573},
		{0, 100, 0, 0.0299573},
		{1, 1, 0.05129, 4.74386},
		{10, 1, 5.4254, 16.962},
		{10, 50, 5.4254 / 50, 16.962 / 50},
		{200, 1000, 0.177320, 0.224874}, // by bisection on the Poisson tail in Python
	} {
		lo, hi := rateInterval(c.k, c.t, 0.90)
		if math.Abs(lo-c.lo) > 1e-3*max(c.lo, 1e-9)+1e-6 || math.Abs(hi-c.hi) > 1e-3*c.hi {
			t.Errorf("RateInterval(%d, %g)=[%.6g, %.6g], want [%.6g, %.6g]", c.k, c.t, lo, hi, c.lo, c.hi)
		}
	}
	if lo, hi := rateInterval(3, 0, 0.9); !math.IsNaN(lo) || !math.IsNaN(hi) {
		t.Errorf("no exposure: [%v, %v], want NaN", lo, hi)
	}
}

// The interval covers the true rate at least 90 % of the time, for small
// and large means (its defining property).
func TestRateInterval_Coverage(t *testing.T) {
	for _, mean := range []float64{0.5, 3, 20} {
		var cover float64
		p := math.Exp(-mean) // Poisson pmf, k = 0
		for k := 0; k < 200; k++ {
			lo, hi := rateInterval(k, 1, 0.90)
			if lo <= mean && mean <= hi {
				cover += p
			}
			p *= mean / float64(k+1)
		}
		if cover < 0.90 {
			t.Errorf("mean %g: coverage %.4f, want ≥ 0.90", mean, cover)
		}
	}
}

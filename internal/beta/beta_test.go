package beta

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestLogB(t *testing.T) {
	// B(1, 1) = 1, B(2, 3) = 1/12, B(½, ½) = π.
	for _, c := range []struct{ a, b, want float64 }{{1, 1, 1}, {2, 3, 1.0 / 12}, {0.5, 0.5, math.Pi}} {
		if got := math.Exp(LogB(c.a, c.b)); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("B(%v, %v)=%v, want %v", c.a, c.b, got, c.want)
		}
	}
}

func TestPosteriorMean(t *testing.T) {
	one := Mixture{{2, 3}, {2, 3}} // both components alike: a plain Beta(2, 3)
	if got, want := one.PosteriorMean(4, 1), 6.0/10; math.Abs(got-want) > 1e-12 {
		t.Fatalf("mean=%v, want %v", got, want)
	}
	m := Mixture{{4.5, 0.5}, {0.5, 4.5}}
	if got := m.PosteriorMean(0, 0); math.Abs(got-0.5) > 1e-12 {
		t.Fatalf("prior mean=%v, want 0.5", got)
	}
	// One success moves nearly all the weight to the first component.
	if got := m.PosteriorMean(1, 0); got < 0.8 || got > 0.9 {
		t.Fatalf("mean after one success=%v, want in [0.8, 0.9]", got)
	}
}

func TestGammaAndDraw(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, shape := range []float64{0.5, 1.2, 7} {
		var s float64
		const n = 20000
		for range n {
			s += Gamma(rng, shape)
		}
		if m := s / n; math.Abs(m-shape) > 0.05*shape {
			t.Errorf("Gamma(%v) mean %v", shape, m)
		}
	}
	m := Mixture{{4.5, 0.5}, {0.5, 4.5}}
	for _, sf := range [][2]int{{0, 0}, {2, 0}, {0, 3}} {
		var s float64
		const n = 20000
		for range n {
			s += m.Draw(rng, sf[0], sf[1])
		}
		if got, want := s/n, m.PosteriorMean(sf[0], sf[1]); math.Abs(got-want) > 0.01 {
			t.Errorf("draws after %v: mean %v, want %v", sf, got, want)
		}
	}
}

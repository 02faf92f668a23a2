// Package beta is the arithmetic of the notice-success model, shared by the
// live scheduler (pkg/checkpoint, regret.go) and the simulator's advice
// (pkg/simulate), which must draw from the same model the scheduler uses:
// a mixture of beta distributions updated with success and failure counts,
// and the gamma variates its beta variates are drawn from.
package beta

import (
	"math"
	"math/rand/v2"
)

// Mixture is ½·Beta(α₀, β₀) + ½·Beta(α₁, β₁), each component as {α, β}.
type Mixture [2][2]float64

// LogB returns log B(a, b), the log of the beta function.
func LogB(a, b float64) float64 {
	x, _ := math.Lgamma(a)
	y, _ := math.Lgamma(b)
	z, _ := math.Lgamma(a + b)
	return x + y - z
}

// weights returns the posterior weight of each component after s successes
// and f failures, relative to the largest (which is 1).
func (m Mixture) weights(s, f float64) [2]float64 {
	var w [2]float64
	top := math.Inf(-1)
	for k, ab := range m {
		w[k] = LogB(ab[0]+s, ab[1]+f) - LogB(ab[0], ab[1])
		top = max(top, w[k])
	}
	for k := range w {
		w[k] = math.Exp(w[k] - top)
	}
	return w
}

// PosteriorMean returns the posterior mean after s successes and f failures.
func (m Mixture) PosteriorMean(s, f int) float64 {
	c, l := float64(s), float64(f)
	w := m.weights(c, l)
	var sw, sm float64
	for k, ab := range m {
		sw += w[k]
		mean := (ab[0] + c) / (ab[0] + ab[1] + c + l) // the component's posterior mean
		sm += w[k] * mean
	}
	return sm / sw
}

// Draw draws from the posterior after s successes and f failures: a
// component by its posterior weight, then a beta variate from it.
func (m Mixture) Draw(rng *rand.Rand, s, f int) float64 {
	c, l := float64(s), float64(f)
	w := m.weights(c, l)
	var sw float64
	for _, x := range w {
		sw += x
	}
	u, k := rng.Float64()*sw, 0
	for k < len(w)-1 && u > w[k] {
		u -= w[k]
		k++
	}
	x := Gamma(rng, m[k][0]+c)
	y := Gamma(rng, m[k][1]+l)
	if x+y == 0 {
		return 0.5
	}
	return x / (x + y)
}

// Gamma returns a Gamma(shape, 1) variate (Marsaglia and Tsang, 2000;
// shape < 1 through Gamma(shape+1)·U^(1/shape)).
func Gamma(rng *rand.Rand, shape float64) float64 {
	if shape <= 0 {
		return 0
	}
	if shape < 1 {
		return Gamma(rng, shape+1) * math.Pow(rng.Float64(), 1/shape)
	}
	d := shape - 1.0/3
	c := 1 / math.Sqrt(9*d)
	for {
		x := rng.NormFloat64()
		v := 1 + c*x
		if v <= 0 {
			continue
		}
		v = v * v * v
		u := rng.Float64()
		if math.Log(u) < 0.5*x*x+d-d*v+d*math.Log(v) {
			return d * v
		}
	}
}

package fleet

import (
	"math"
	"sync"
)

// Confidence is the coverage of the rate intervals in reports.
const Confidence = 0.90

// rateInterval is the exact (Garwood) two-sided interval for a Poisson rate
// from k events in exposure t (hours): [G(α/2; k), G(1−α/2; k+1)] / t with
// G(q; a) the q-quantile of Gamma(a, 1) and α = 1 − conf. It covers the
// true rate with probability ≥ conf, also for k = 0 (the lower end is then
// 0 and the upper −ln(α/2)/t: 3.0/t at 90 %). t ≤ 0 gives NaN.
func rateInterval(k int, t, conf float64) (lo, hi float64) {
	if t <= 0 {
		return math.NaN(), math.NaN()
	}
	a := (1 - conf) / 2
	if k > 0 {
		lo = gammaQuantile(a, float64(k)) / t
	}
	hi = gammaQuantile(1-a, float64(k+1)) / t
	return lo, hi
}

// quantiles remembers gammaQuantile's answers: a report asks for the same
// few (q, k) for every one of 100,000 runs, and each costs ~100 gammaP.
var quantiles sync.Map // [2]float64{q, a} → float64

// gammaQuantile returns x with P(a, x) = q, P the regularized lower
// incomplete gamma function (the CDF of Gamma(a, 1)), by bisection: P is
// monotone in x, and 200 halvings reach float64 precision from any bracket.
func gammaQuantile(q, a float64) float64 {
	key := [2]float64{q, a}
	if x, ok := quantiles.Load(key); ok {
		return x.(float64)
	}
	x := bisectGamma(q, a)
	quantiles.Store(key, x)
	return x
}

func bisectGamma(q, a float64) float64 {
	lo, hi := 0.0, a+10*math.Sqrt(a)+10
	for gammaP(a, hi) < q {
		lo, hi = hi, 2*hi
	}
	for range 200 {
		mid := (lo + hi) / 2
		if mid == lo || mid == hi {
			break
		}
		if gammaP(a, mid) < q {
			lo = mid
		} else {
			hi = mid
		}
	}
	return (lo + hi) / 2
}

// gammaP is the regularized lower incomplete gamma function P(a, x): its
// power series below x = a+1, 1 − the continued fraction for Q above
// (Numerical Recipes §6.2, the modified Lentz method).
func gammaP(a, x float64) float64 {
	if x <= 0 {
		return 0
	}
	lg, _ := math.Lgamma(a)
	pre := math.Exp(-x + a*math.Log(x) - lg)
	if x < a+1 {
		sum, term := 1/a, 1/a
		for n := 1.0; n < 1000; n++ {
			term *= x / (a + n)
			sum += term
			if math.Abs(term) < math.Abs(sum)*1e-16 {
				break
			}
		}
		return sum * pre
	}
	const tiny = 1e-300
	b := x + 1 - a
	c, d := 1/tiny, 1/b
	h := d
	for i := 1.0; i < 1000; i++ {
		an := -i * (i - a)
		b += 2
		d = an*d + b
		if math.Abs(d) < tiny {
			d = tiny
		}
		c = b + an/c
		if math.Abs(c) < tiny {
			c = tiny
		}
		d = 1 / d
		del := d * c
		h *= del
		if math.Abs(del-1) < 1e-16 {
			break
		}
	}
	return 1 - pre*h
}

package schedule

import (
	"math"
	"sync"
	"time"

	"github.com/spotagent/spotagent/internal/beta"
)

// The interval under uncertainty (docs/frequency.md, "Relative regret").
//
// The scheduler knows the interruption rate λ and the fraction p of
// interruptions whose notice checkpoint commits only through posteriors:
// λ ~ Gamma(a, b) per hour of run time, p ~ a two-component Beta mixture.
// Plugging the posterior means into Daly's formula minimises the expected
// waste, which is linear in the loss rate u = λ·(1−p). But a run pays in one
// world, not the average of them, and in the worlds where notices nearly
// always commit the best achievable waste is tiny, so a short interval
// there costs a large multiple of it. The scheduler minimises the expected
// ratio of its interval-dependent waste to the best achievable one instead:
//
//	f(τ; u) = δ/τ + u·τ/2                  waste per unit of run time
//	f*(u)   = min over τ in [Min, Max] of f(τ; u)
//	τ       = argmin E[f(τ; u)/f*(u)] = √(2δ·E[1/f*] / E[u/f*])
//
// which is Young's interval for the effective loss rate
// u_eff = E[u/f*] / E[1/f*]; Daly's correction is applied to M = 1/u_eff
// as before. When the posterior is narrow, u_eff → E[u] and the interval
// is the plug-in one; when it is wide, worlds with small u weigh more.

// noticeMix is the prior of p: ½·Beta(h, l) + ½·Beta(l, h) with h = 4.5 and
// l = ½, i.e. "notices commit about 90 % of the time, or about 10 %", each
// worth five observations. Mean ½ as Jeffreys' Beta(½,½), but one committed
// notice moves the mean of 1−p from ½ to 0.15 (Jeffreys: 0.25) and one
// lost interruption moves it to 0.85 (Jeffreys: 0.75).
var noticeMix = beta.Mixture{{4.5, 0.5}, {0.5, 4.5}}

// regretPoints is the number of quadrature points per dimension.
const regretPoints = 48

// regretKey is what the effective loss rate depends on. The scheduler
// caches the last one: the inputs change at most hourly or per checkpoint.
type regretKey struct {
	a, b             float64 // Gamma posterior of λ: shape, rate (per hour)
	committed, lost  int     // interruptions whose notice checkpoint committed / did not
	factor           float64 // live hazard factor on λ
	delta, min, maxI time.Duration
}

// noticePosterior returns the log weight of p = sin²θ (θ uniform) under
// the mixture prior and committed/lost observations, up to a constant.
func noticePosterior(p, q float64, committed, lost int) float64 {
	lp, lq := math.Log(p), math.Log(q)
	var terms [len(noticeMix)]float64
	top := math.Inf(-1)
	for m, ab := range noticeMix {
		// Beta(a,b) density in θ: ∝ p^(a−½)·q^(b−½)/B(a,b).
		terms[m] = (ab[0]-0.5+float64(committed))*lp + (ab[1]-0.5+float64(lost))*lq - beta.LogB(ab[0], ab[1])
		top = max(top, terms[m])
	}
	var s float64
	for _, t := range terms {
		s += math.Exp(t - top)
	}
	return top + math.Log(s)
}

// noticeMean returns the posterior mean of p.
func noticeMean(committed, lost int) float64 { return noticeMix.PosteriorMean(committed, lost) }

// regretCache memoises effectiveLossRate across schedulers: a simulation
// starts a scheduler per machine life and meets the same inputs again and
// again. Bounded: it is emptied when full.
var regretCache struct {
	sync.Mutex
	m map[regretKey]float64
}

const regretCacheMax = 1 << 16

// effectiveLossRate returns u_eff per hour for k (0 when λ is surely 0).
func effectiveLossRate(k regretKey) float64 {
	regretCache.Lock()
	v, ok := regretCache.m[k]
	regretCache.Unlock()
	if ok {
		return v
	}
	v = computeLossRate(k)
	regretCache.Lock()
	if regretCache.m == nil || len(regretCache.m) >= regretCacheMax {
		regretCache.m = make(map[regretKey]float64)
	}
	regretCache.m[k] = v
	regretCache.Unlock()
	return v
}

func computeLossRate(k regretKey) float64 {
	if k.a <= 0 || k.b <= 0 {
		return 0
	}
	d, lo, hi := k.delta.Seconds(), k.min.Seconds(), k.maxI.Seconds()
	if d <= 0 || lo <= 0 {
		return k.a / k.b * k.factor * (1 - noticeMean(k.committed, k.lost))
	}
	// x = log λ: density ∝ exp(a·x − b·eˣ), mode log(a/b), sd ≈ 1/√a.
	mode, sd := math.Log(k.a/k.b), 1/math.Sqrt(k.a)
	xlo, xhi := mode-6*sd-0.5, mode+4*sd+0.5
	var lam, lw [regretPoints]float64
	for i := range lam {
		x := xlo + (xhi-xlo)*(float64(i)+0.5)/regretPoints
		lam[i] = math.Exp(x)
		lw[i] = k.a*x - k.b*lam[i]
	}
	normalize(lw[:])
	var q, qw [regretPoints]float64
	for j := range q {
		th := math.Pi / 2 * (float64(j) + 0.5) / regretPoints
		s, c := math.Sin(th), math.Cos(th)
		q[j] = c * c
		qw[j] = noticePosterior(s*s, c*c, k.committed, k.lost)
	}
	normalize(qw[:])
	var num, den float64
	for i, l := range lam {
		perSec := l * k.factor / 3600
		for j, qq := range q {
			w := lw[i] * qw[j]
			if w < 1e-12 {
				continue
			}
			u := perSec * qq
			t := hi
			if u > 0 {
				t = min(max(math.Sqrt(2*d/u), lo), hi)
			}
			fstar := d/t + u*t/2
			num += w * u / fstar
			den += w / fstar
		}
	}
	if den == 0 {
		return 0
	}
	return num / den * 3600
}

// normalize turns log weights into weights with maximum 1.
func normalize(lw []float64) {
	top := math.Inf(-1)
	for _, v := range lw {
		top = max(top, v)
	}
	for i, v := range lw {
		lw[i] = math.Exp(v - top)
	}
}

// The scheduler's priors, for the simulator's advice (pkg/simulate), which
// must draw from the same model the live scheduler uses.

// PriorWeight is how much run time the interruption-rate prior is worth.
const PriorWeight = priorWeight

// NoticeMix is the notice-success prior.
func NoticeMix() beta.Mixture { return noticeMix }

// NoticeMean is the posterior mean of the notice success after committed
// and lost interruptions.
func NoticeMean(committed, lost int) float64 { return noticeMean(committed, lost) }

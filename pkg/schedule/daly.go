package schedule

import (
	"math"
	"time"
)

// DalyInterval returns the optimum compute time between the end of one
// checkpoint and the start of the next, for a blocking checkpoint cost delta
// and a mean time to an unrecoverable interruption m, by Daly's higher-order
// estimate (J. T. Daly, "A higher order estimate of the optimum checkpoint
// interval for restart dumps", FGCS 22(3), 2006, eq. 37):
//
//	τ = √(2δM)·[1 + ⅓·√(δ/2M) + ⅑·(δ/2M)] − δ   for δ < 2M
//	τ = M                                        for δ ≥ 2M
//
// The first factor alone is Young's first-order √(2δM). τ excludes δ: the
// period from one checkpoint request to the next is τ + δ. Daly's worked
// example (M = 24 h, δ = 5 min) gives 116.7 min, his "τopt = 117 min".
// A non-positive m returns 0; a non-positive delta returns 0 (checkpoints are
// free, so take them as often as the caller's clamp allows).
func DalyInterval(delta, m time.Duration) time.Duration {
	if m <= 0 || delta <= 0 {
		return 0
	}
	d, mm := delta.Seconds(), m.Seconds()
	if d >= 2*mm {
		return m
	}
	x := d / (2 * mm)
	tau := math.Sqrt(2*d*mm)*(1+math.Sqrt(x)/3+x/9) - d
	return time.Duration(tau * float64(time.Second))
}

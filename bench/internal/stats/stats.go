// Package stats holds the statistics spotbench's tables print: medians,
// nearest-rank percentiles, and unit conversions.
package stats

import (
	"slices"
	"time"
)

// Median is the median of xs (0 for none).
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// Pct is the nearest-rank percentile (p in 0..1).
func Pct(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(p*float64(len(s))+0.999999) - 1
	return s[max(0, min(len(s)-1, i))]
}

// MinMax is the smallest and largest of xs.
func MinMax(xs []float64) (float64, float64) {
	return slices.Min(xs), slices.Max(xs)
}

// MS is d in milliseconds.
func MS(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// MBps is bytes over d in 10⁶ bytes per second.
func MBps(bytes int64, d time.Duration) float64 { return float64(bytes) / d.Seconds() / 1e6 }

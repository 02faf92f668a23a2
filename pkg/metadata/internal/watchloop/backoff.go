// Package watchloop holds what the metadata sources (aws, gcp, azure)
// share in their watch loops: backoff, de-duplication, delivery and
// logging of notices, and rate-limited logging of faults.
package watchloop

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff computes exponential retry delays with jitter, from Min doubling
// up to Max. The zero value is usable (100ms .. 5s). Not safe for
// concurrent use: keep one per loop.
type Backoff struct {
	Min, Max time.Duration
	n        int
}

// Next returns the delay before the next retry and advances the backoff.
func (b *Backoff) Next() time.Duration {
	lo, hi := b.Min, b.Max
	if lo <= 0 {
		lo = 100 * time.Millisecond
	}
	if hi < lo {
		hi = max(lo, 5*time.Second)
	}
	d := lo << min(b.n, 30)
	if d <= 0 || d > hi {
		d = hi
	} else {
		b.n++
	}
	// Jitter in [d/2, d]: retries of several agents do not line up.
	return d/2 + rand.N(d/2+1)
}

// Reset starts over from Min after a success.
func (b *Backoff) Reset() { b.n = 0 }

// Sleep waits d or until ctx ends, whichever comes first, and returns
// ctx.Err() when ctx ended.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

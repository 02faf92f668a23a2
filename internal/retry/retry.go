// Package retry is the module's one retry helper: exponential backoff with
// jitter, a sleep that ends with its context, and Do, which runs an
// operation until it succeeds, fails for good, runs out of attempts or its
// context ends. The store's retry wrapper (pkg/cloud/all), Download's
// resume, the fleet summary's compare-and-swap and the metadata poll
// loops all wait through it.
package retry

import (
	"context"
	"errors"
	"fmt"
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

// Capped is b with no delay above d (d > 0): Min and Max bounded by it,
// the zero value's defaults included.
func (b Backoff) Capped(d time.Duration) Backoff {
	if b.Min <= 0 {
		b.Min = 100 * time.Millisecond
	}
	if b.Max < b.Min {
		b.Max = max(b.Min, 5*time.Second)
	}
	b.Min, b.Max = min(b.Min, d), min(b.Max, d)
	return b
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

// Policy says how Do retries. The zero value makes one attempt.
type Policy struct {
	// Attempts is the most attempts Do makes, the first included; below
	// one means one.
	Attempts int
	// Backoff spaces the attempts; its zero value waits 100ms .. 5s.
	Backoff Backoff
	// Retryable reports whether an error is worth another attempt; nil
	// retries every error. An error of the context itself is never
	// retried.
	Retryable func(error) bool
	// OnRetry, when set, is called before each wait with the attempt that
	// failed (1 for the first), the wait and the error.
	OnRetry func(attempt int, wait time.Duration, err error)
}

// Do calls fn until it returns nil, returns an error p does not retry, has
// been called p.Attempts times, or ctx ends. It returns fn's last error,
// or, once ctx has ended, at once an error that wraps ctx.Err(): it never
// waits or calls fn again after ctx ends, and does not call fn at all
// with a context already ended.
func Do(ctx context.Context, p Policy, fn func(ctx context.Context) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	bo := p.Backoff
	for attempt := 1; ; attempt++ {
		err := fn(ctx)
		if err == nil {
			return nil
		}
		if cerr := ctx.Err(); cerr != nil {
			return ctxError(cerr, err)
		}
		if attempt >= p.Attempts || (p.Retryable != nil && !p.Retryable(err)) {
			return err
		}
		wait := bo.Next()
		if p.OnRetry != nil {
			p.OnRetry(attempt, wait, err)
		}
		if cerr := Sleep(ctx, wait); cerr != nil {
			return ctxError(cerr, err)
		}
	}
}

// ctxError is the error Do returns once ctx ended: err itself when it
// already says so, else ctx's error with err's text.
func ctxError(cerr, err error) error {
	if errors.Is(err, cerr) {
		return err
	}
	return fmt.Errorf("%w (last attempt: %v)", cerr, err)
}

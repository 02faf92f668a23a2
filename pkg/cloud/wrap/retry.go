// Package wrap holds the layers all.Open stacks once around every plain
// backend (restic's internal/backend retry and logger are the model):
// Retry (retries with backoff, honouring ctx), Log (each operation, no
// secrets) and Observe (metrics). A backend makes one attempt of each
// operation; see Retry for the one exception, Put.
package wrap

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/internal/retry"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// Retry's defaults: ten attempts spaced 250 ms doubling up to 20 s (about
// a minute in all, less when the caller's deadline comes first), as the
// S3 SDK was configured before the retries moved here.
const (
	defaultAttempts = 10
	minWait         = 250 * time.Millisecond
	maxWait         = 20 * time.Second
)

// RetryOptions tunes Retry. The zero value uses the defaults.
type RetryOptions struct {
	Attempts int           // per operation, the first included (default 10)
	MinWait  time.Duration // first wait (default 250 ms), doubling
	MaxWait  time.Duration // longest wait (default 20 s)
	// Retryable classifies the errors that Permanent does not: the
	// backend's own (its SDK's) judgement. nil retries all of them.
	Retryable func(error) bool
	Log       *zap.Logger
}

// Permanent reports whether err can never be cured by another attempt:
// a missing object or bucket, a lost conditional write (compare-and-swap
// conflict), refused credentials or permissions, an invalid key.
func Permanent(err error) bool {
	for _, target := range []error{cloud.ErrNotExist, cloud.ErrPrecondition, cloud.ErrAccessDenied,
		cloud.ErrBucketNotFound, cloud.ErrInvalidKey, fs.ErrPermission} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

type retrying struct {
	cloud.Store
	policy retry.Policy
	log    *zap.Logger
}

// Retry wraps st so that Get, Stat, List, Delete and Cleanup are retried
// with backoff while they fail with an error that is not Permanent and
// that o.Retryable accepts, up to o.Attempts, and never after ctx ends: a
// cancelled or expired ctx returns at once with an error wrapping
// ctx.Err(). List resumes after the last key it delivered, so fn sees each
// key once, in order; an error from fn is returned, not retried.
//
// Put is not retried here: its reader is a stream (hashed as it is read)
// that cannot be replayed, and the part or chunk being sent is in the
// backend's buffer, so the backend's SDK retries each of Put's requests
// (aws-sdk-go-v2's retryer, the GCS library's); those requests are the
// only ones the SDKs retry, and Retry retries only the others, so no
// request is retried in two places.
func Retry(st cloud.Store, o RetryOptions) cloud.Store {
	if o.Attempts <= 0 {
		o.Attempts = defaultAttempts
	}
	if o.MinWait <= 0 {
		o.MinWait = minWait
	}
	if o.MaxWait <= 0 {
		o.MaxWait = maxWait
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	r := &retrying{Store: st, log: o.Log}
	r.policy = retry.Policy{
		Attempts: o.Attempts,
		Backoff:  retry.Backoff{Min: o.MinWait, Max: o.MaxWait},
		Retryable: func(err error) bool {
			var s stop
			return !errors.As(err, &s) && !Permanent(err) && (o.Retryable == nil || o.Retryable(err))
		},
	}
	return r
}

// do runs fn under the policy, logging each retry with the operation and
// its key (never a credential).
func (r *retrying) do(ctx context.Context, op, key string, fn func(ctx context.Context) error) error {
	p := r.policy
	if d := cloud.MaxWait(ctx); d > 0 {
		p.Backoff = p.Backoff.Capped(d)
	}
	p.OnRetry = func(attempt int, wait time.Duration, err error) {
		r.log.Warn("store operation failed, retrying", zap.String("op", op), zap.String("key", key),
			zap.Int("attempt", attempt), zap.Int("attempts", p.Attempts), zap.Duration("wait", wait), zap.Error(err))
	}
	return retry.Do(ctx, p, fn)
}

func (r *retrying) Get(ctx context.Context, key string, offset, length int64) (rc io.ReadCloser, err error) {
	err = r.do(ctx, "get", key, func(ctx context.Context) error {
		rc, err = r.Store.Get(ctx, key, offset, length)
		return err
	})
	return rc, err
}

func (r *retrying) Stat(ctx context.Context, key string) (oi cloud.ObjectInfo, err error) {
	err = r.do(ctx, "stat", key, func(ctx context.Context) error {
		oi, err = r.Store.Stat(ctx, key)
		return err
	})
	return oi, err
}

func (r *retrying) Delete(ctx context.Context, key string) error {
	return r.do(ctx, "delete", key, func(ctx context.Context) error { return r.Store.Delete(ctx, key) })
}

// List retries a listing that broke off, skipping the keys fn already saw
// (the contract lists in lexical order, so those are the keys up to the
// last one delivered).
func (r *retrying) List(ctx context.Context, prefix string, fn func(cloud.ObjectInfo) error) error {
	var last string
	seen := false
	var fnErr error
	err := r.do(ctx, "list", prefix, func(ctx context.Context) error {
		err := r.Store.List(ctx, prefix, func(oi cloud.ObjectInfo) error {
			if seen && oi.Key <= last {
				return nil
			}
			last, seen = oi.Key, true
			fnErr = fn(oi)
			return fnErr
		})
		if fnErr != nil {
			return stop{fnErr}
		}
		return err
	})
	if fnErr != nil {
		return fnErr
	}
	return err
}

// stop carries an error that ends an operation without a retry: fn's in
// List.
type stop struct{ err error }

func (s stop) Error() string { return s.err.Error() }
func (s stop) Unwrap() error { return s.err }

func (r *retrying) Cleanup(ctx context.Context, opts ...cloud.CleanupOptions) (int, error) {
	n := 0
	err := r.do(ctx, "cleanup", "", func(ctx context.Context) error {
		m, err := cleanup(ctx, r.Store, opts)
		n += m
		return err
	})
	return n, err
}

// Retryable reports whether an operation that failed with err is worth
// another attempt, as Retry judges it: not Permanent, and the backend's
// own classification (RetryOptions.Retryable) agrees. A caller that
// retries a whole sequence of operations (the run journal's
// compare-and-swap) asks it.
func (r *retrying) Retryable(err error) bool { return r.policy.Retryable(err) }

// Unwrap returns the store Retry wrapped.
func (r *retrying) Unwrap() cloud.Store { return r.Store }

// cleanup runs st's Cleanup, or removes nothing when st has none.
func cleanup(ctx context.Context, st cloud.Store, opts []cloud.CleanupOptions) (int, error) {
	if c, ok := st.(cloud.Cleaner); ok {
		return c.Cleanup(ctx, opts...)
	}
	return 0, nil
}

package wrap

import (
	"context"
	"errors"
	"io"
	"time"

	"github.com/spotagent/spotagent/pkg/cloud"
)

// Observer receives every store operation (each attempt, under Retry) as
// it ends: the operation (put, get, stat, list, delete, cleanup), its
// result (ok, not_found, precondition, denied, cancelled or error) and
// how long it took (for get, until the first byte). pkg/metrics
// implements it.
type Observer interface {
	StoreOp(op, result string, took time.Duration)
}

// result names the outcome of an operation for a metric label: ok,
// not_found, precondition, denied, cancelled or error.
func result(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, cloud.ErrNotExist):
		return "not_found"
	case errors.Is(err, cloud.ErrPrecondition):
		return "precondition"
	case errors.Is(err, cloud.ErrAccessDenied):
		return "denied"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "cancelled"
	}
	return "error"
}

type observed struct {
	cloud.Store
	obs Observer
}

// Observe wraps st so that obs sees every operation.
func Observe(st cloud.Store, obs Observer) cloud.Store {
	return &observed{Store: st, obs: obs}
}

func (o *observed) done(op string, start time.Time, err error) {
	o.obs.StoreOp(op, result(err), time.Since(start))
}

func (o *observed) Put(ctx context.Context, key string, r io.Reader, size int64, opts cloud.PutOptions) error {
	start := time.Now()
	err := o.Store.Put(ctx, key, r, size, opts)
	o.done("put", start, err)
	return err
}

func (o *observed) Get(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error) {
	start := time.Now()
	rc, err := o.Store.Get(ctx, key, offset, length)
	o.done("get", start, err)
	return rc, err
}

func (o *observed) Stat(ctx context.Context, key string) (cloud.ObjectInfo, error) {
	start := time.Now()
	oi, err := o.Store.Stat(ctx, key)
	o.done("stat", start, err)
	return oi, err
}

func (o *observed) List(ctx context.Context, prefix string, fn func(cloud.ObjectInfo) error) error {
	start := time.Now()
	err := o.Store.List(ctx, prefix, fn)
	o.done("list", start, err)
	return err
}

func (o *observed) Delete(ctx context.Context, key string) error {
	start := time.Now()
	err := o.Store.Delete(ctx, key)
	o.done("delete", start, err)
	return err
}

func (o *observed) Cleanup(ctx context.Context, opts ...cloud.CleanupOptions) (int, error) {
	start := time.Now()
	n, err := cleanup(ctx, o.Store, opts)
	o.done("cleanup", start, err)
	return n, err
}

// Unwrap returns the store Observe wrapped.
func (o *observed) Unwrap() cloud.Store { return o.Store }

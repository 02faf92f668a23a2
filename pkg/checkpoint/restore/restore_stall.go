package restore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/spotagent/spotagent/pkg/cloud"
)

// defaultStall is how long a restore waits for a store request that makes
// no progress (no answer, or no byte of the body) before it fails it: a
// GET that never answers must not hold the trainer's start forever.
const defaultStall = time.Minute

// ErrStalled reports a store request that made no progress for the stall
// timeout.
var ErrStalled = errors.New("store request made no progress")

// stallStore fails a request of st that makes no progress for stall: a
// Get whose answer or next body bytes do not come, a Stat, or a List whose
// next object does not come. A trickle is progress (and logged as such by
// the download); only silence is cut.
type stallStore struct {
	cloud.Store
	stall time.Duration
}

func withStall(st cloud.Store, stall time.Duration) cloud.Store {
	if stall <= 0 {
		return st
	}
	return stallStore{Store: st, stall: stall}
}

// watchdog cancels its context once kick was not called for d.
type watchdog struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	mu     sync.Mutex
	t      *time.Timer
	d      time.Duration
}

func newWatchdog(ctx context.Context, d time.Duration, what string) *watchdog {
	w := &watchdog{d: d}
	w.ctx, w.cancel = context.WithCancelCause(ctx)
	w.t = time.AfterFunc(d, func() { w.cancel(fmt.Errorf("%s: %w for %s", what, ErrStalled, d)) })
	return w
}

func (w *watchdog) kick() { w.t.Reset(w.d) }

func (w *watchdog) stop() { w.t.Stop(); w.cancel(nil) }

// err is the stall (wrapping ErrStalled) if the watchdog fired, else err.
func (w *watchdog) err(err error) error {
	if err == nil {
		return nil
	}
	if c := context.Cause(w.ctx); errors.Is(c, ErrStalled) {
		return c
	}
	return err
}

func (s stallStore) Get(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	w := newWatchdog(ctx, s.stall, "get "+key)
	rc, err := s.Store.Get(w.ctx, key, off, n)
	if err != nil {
		w.stop()
		return nil, w.err(err)
	}
	w.kick()
	return &stallReader{rc: rc, w: w}, nil
}

type stallReader struct {
	rc io.ReadCloser
	w  *watchdog
}

func (r *stallReader) Read(p []byte) (int, error) {
	n, err := r.rc.Read(p)
	if n > 0 {
		r.w.kick()
	}
	if err != nil && !errors.Is(err, io.EOF) {
		err = r.w.err(err)
	}
	return n, err
}

func (r *stallReader) Close() error {
	err := r.rc.Close()
	r.w.stop()
	return err
}

func (s stallStore) Stat(ctx context.Context, key string) (cloud.ObjectInfo, error) {
	w := newWatchdog(ctx, s.stall, "stat "+key)
	defer w.stop()
	info, err := s.Store.Stat(w.ctx, key)
	return info, w.err(err)
}

func (s stallStore) List(ctx context.Context, prefix string, fn func(cloud.ObjectInfo) error) error {
	w := newWatchdog(ctx, s.stall, "list "+prefix)
	defer w.stop()
	err := s.Store.List(w.ctx, prefix, func(o cloud.ObjectInfo) error {
		w.kick()
		return fn(o)
	})
	return w.err(err)
}

package restore

// Where each restored file's bytes come from: the nearer tiers first (a
// copy refused once is not asked again), else the store, whose requests a
// watchdog fails when they stall.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"sync"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud"
	"go.uber.org/zap"
)

// sources is what one restore fetches from: the tiers, then the store.
type sources struct {
	m     *checkpoint.Manifest
	tiers []checkpoint.Tier
	log   *zap.Logger
	mu    sync.Mutex
	bytes map[string]int64
	// refused are the tiers (by index) a copy of which failed
	// verification: not asked again in this restore.
	refused  map[int]bool
	noDigest sync.Once
}

func (s *sources) isRefused(i int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refused[i]
}

// refuse records that a copy from tier i failed verification: that copy
// is dropped (a tier of copies that are each their own source,
// checkpoint.CopyRefuser), or its source is not asked again in this
// restore (the copy's own, when it can be told, checkpoint.Refusable; else
// the whole tier).
func (s *sources) refuse(i int, rc io.ReadCloser, f checkpoint.File, err error) {
	if c, ok := s.tiers[i].(checkpoint.CopyRefuser); ok {
		c.RefuseCopy(s.m, f, err)
		s.log.Warn("nearby copy failed verification: fetching the file again", zap.String("tier", s.tiers[i].Name()), zap.String("file", f.Path), zap.Error(err))
		return
	}
	if r, ok := rc.(checkpoint.Refusable); ok {
		r.Refuse(err)
		s.log.Warn("nearby copy failed verification: fetching the file again, and not asking its source again in this restore",
			zap.String("tier", s.tiers[i].Name()), zap.String("file", f.Path), zap.Error(err))
		return
	}
	s.mu.Lock()
	if s.refused == nil {
		s.refused = map[int]bool{}
	}
	s.refused[i] = true
	s.mu.Unlock()
	s.log.Warn("nearby copy failed verification: fetching the file again, and not asking this tier again in this restore",
		zap.String("tier", s.tiers[i].Name()), zap.String("file", f.Path), zap.Error(err))
}

// warnNoDigest says, once per restore, that files without a digest come
// from the store only.
func (s *sources) warnNoDigest() {
	s.noDigest.Do(func() {
		n := 0
		for _, f := range s.m.Files {
			if !f.HasDigest() {
				n++
			}
		}
		s.log.Warn("the manifest records no digest for some files (committed before digests): they are restored from the store, never from a nearby copy",
			zap.Int("files", n), zap.Int("of", len(s.m.Files)))
	})
}

func (s *sources) add(from string, n int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bytes == nil {
		s.bytes = map[string]int64{}
	}
	s.bytes[from] += n
}

func (s *sources) from() map[string]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.bytes)
}

// fromTiers fills out (new, empty) with f from the first tier whose copy
// matches f's digest: true. false: none did, or f records no digest; out
// is empty again, the store's turn.
func (s *sources) fromTiers(ctx context.Context, out *os.File, f checkpoint.File, p *checkpoint.Progress) (bool, error) {
	if len(s.tiers) == 0 {
		return false, nil
	}
	if !f.HasDigest() {
		s.warnNoDigest()
		return false, nil
	}
	for i, t := range s.tiers {
		if s.isRefused(i) {
			continue
		}
		rc, err := t.Open(ctx, s.m, f)
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				s.log.Warn("nearby copy unreadable: fetching the file from the store", zap.String("tier", t.Name()), zap.String("file", f.Path), zap.Error(err))
			}
			continue
		}
		err = checkpoint.CopyDigestVerified(out, rc, f, p)
		if err == nil {
			rc.Close()
			s.add(t.Name(), f.Size)
			return true, nil
		}
		if ctx.Err() != nil {
			rc.Close()
			return false, ctx.Err()
		}
		if errors.Is(err, checkpoint.ErrCorrupt) {
			s.refuse(i, rc, f, err)
		} else {
			s.log.Warn("nearby copy unreadable: fetching the file again", zap.String("tier", t.Name()), zap.String("file", f.Path), zap.Error(err))
		}
		rc.Close()
		if err := out.Truncate(0); err != nil {
			return false, err
		}
		if _, err := out.Seek(0, io.SeekStart); err != nil {
			return false, err
		}
	}
	return false, nil
}

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

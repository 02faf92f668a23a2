package restore

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"maps"
	"os"
	"sync"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint"
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

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
// verifies: true. false: none did, out is empty again, the store's turn.
func (s *sources) fromTiers(ctx context.Context, out *os.File, f checkpoint.File, p *checkpoint.Progress) (bool, error) {
	for _, t := range s.tiers {
		rc, err := t.Open(ctx, s.m, f)
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				s.log.Warn("nearby copy unreadable: fetching the file from the store", zap.String("tier", t.Name()), zap.String("file", f.Path), zap.Error(err))
			}
			continue
		}
		err = copyVerified(out, rc, f, p)
		rc.Close()
		if err == nil {
			s.add(t.Name(), f.Size)
			return true, nil
		}
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		s.log.Warn("nearby copy failed verification: fetching the file from the store", zap.String("tier", t.Name()), zap.String("file", f.Path), zap.Error(err))
		if err := out.Truncate(0); err != nil {
			return false, err
		}
		if _, err := out.Seek(0, io.SeekStart); err != nil {
			return false, err
		}
	}
	return false, nil
}

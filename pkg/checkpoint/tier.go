package checkpoint

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"sync"

	"go.uber.org/zap"
)

// A Tier is a copy of committed checkpoints nearer than the store: this
// machine's disk (pkg/checkpoint/localtier), a peer's (docs/distributed.md).
// Restore chooses the checkpoint by the store's rules first and only then
// asks the tiers, nearest first, for each of its files; what a tier gives
// is verified against the manifest's size and checksum like a download,
// and a file no tier holds, or whose copy fails, comes from the store. A
// tier can therefore make a restore faster, never older or different.
type Tier interface {
	// Name names the tier in logs, the journal and the metrics.
	Name() string
	// Open returns the tier's copy of file f of checkpoint m, or an error
	// wrapping fs.ErrNotExist when it holds none. The caller closes it.
	Open(ctx context.Context, m *Manifest, f File) (io.ReadCloser, error)
}

// Where restored bytes came from (Restored.From), besides a tier's name.
const (
	FromStore = "store"
	// FromLocal is this machine: the local tier, or a verified copy
	// already in the restore directory.
	FromLocal = "local"
	// FromPeer is another node of the job (pkg/checkpoint/peertier).
	FromPeer = "peer"
)

// sources is what one restore fetches from: the tiers, then the store.
type sources struct {
	m     *Manifest
	tiers []Tier
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
func (s *sources) fromTiers(ctx context.Context, out *os.File, f File, p *progress) (bool, error) {
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

// OpenRegular opens the regular file rel below root for reading, of size
// size, refusing a symlink anywhere in rel, a FIFO, a device or another
// size, without ever blocking in open(2): how a tier opens its copies.
func OpenRegular(root *os.Root, rel string, size int64) (*os.File, error) {
	dir, base := path.Split(rel)
	if dir == "" {
		return openRegular(root, base, size)
	}
	sub, err := OpenDir(root, dir)
	if err != nil {
		return nil, err
	}
	defer sub.Close()
	return openRegular(sub, base, size)
}

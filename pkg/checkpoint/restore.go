package checkpoint

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/spotagent/spotagent/pkg/cloud"
)

// ErrNoCheckpoint means the store holds no committed checkpoint: a run
// starts fresh.
var ErrNoCheckpoint = errors.New("no complete checkpoint")

// ErrAllDamaged means checkpoints were committed but none verifies. A run
// must not start fresh over them: a person decides.
var ErrAllDamaged = errors.New("no committed checkpoint verifies")

// ErrCorrupt marks an object whose size or checksum differs from its manifest.
var ErrCorrupt = errors.New("checkpoint damaged")

// RestoreOptions tunes Restore.
type RestoreOptions struct {
	ID  string // restore this checkpoint only; empty: the newest complete one
	Log *zap.Logger
	// MaxEpoch > 0 passes over checkpoints committed under a higher epoch:
	// a newer session's, which fenced the one restoring (lease.go).
	MaxEpoch int64
}

// Restored describes a checkpoint copied to local disk and verified.
type Restored struct {
	Dir      string // local directory holding the checkpoint's files
	Key      string // manifest key in the store
	Manifest *Manifest
	Bytes    int64
	Took     time.Duration
	Skipped  []string // manifests tried first and found broken, with why
}

// Restore copies the newest complete checkpoint (or opts.ID) into a new
// directory under dest and verifies every file's size and sha256 before it
// returns. latest.json is tried first; when it is missing, broken or points
// at a damaged checkpoint, the newest complete manifest is used, with a
// warning. A checkpoint is only returned once every file verified, and its
// directory only appears (by rename) after that.
func Restore(ctx context.Context, st cloud.Store, dest string, opts RestoreOptions) (*Restored, error) {
	start := time.Now()
	log := opts.Log
	if log == nil {
		log = zap.NewNop()
	}
	var skipped []string
	var abort error // not the checkpoint's fault: the disk, the network, ctx
	try := func(key string, m *Manifest) (*Restored, bool) {
		if opts.skipEpoch(m) {
			log.Info("skipping a newer session's checkpoint", zap.String("manifest", key), zap.Int64("epoch", m.Epoch))
			return nil, false
		}
		r, err := restoreOne(ctx, st, dest, key, m, log)
		switch {
		case err == nil:
			r.Took, r.Skipped = time.Since(start), skipped
			return r, true
		case errors.Is(err, ErrCorrupt) || errors.Is(err, cloud.ErrNotExist):
			log.Warn("checkpoint damaged, trying an older one", zap.String("manifest", key), zap.Error(err))
			skipped = append(skipped, fmt.Sprintf("%s: %v", key, err))
		default:
			// An older checkpoint would fail the same way, and giving up
			// on all of them would make the run start from scratch.
			abort = fmt.Errorf("restore %s into %s: %w", key, dest, err)
		}
		return nil, false
	}
	tried := "" // the manifest latest.json named, tried first
	if opts.ID == "" {
		l, err := ReadLatest(ctx, st)
		switch {
		case err == nil:
			tried = l.Manifest
			m, err := ReadManifest(ctx, st, l.Manifest)
			if err == nil {
				if r, ok := try(l.Manifest, m); ok {
					return r, nil
				}
				if abort != nil {
					return nil, abort
				}
			} else {
				log.Warn("latest.json points at a broken manifest", zap.String("manifest", l.Manifest), zap.Error(err))
				skipped = append(skipped, fmt.Sprintf("%s: %v", l.Manifest, err))
			}
		case errors.Is(err, cloud.ErrNotExist):
		default:
			log.Warn("latest.json unreadable, falling back to listing", zap.Error(err))
		}
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	entries, err := ListManifests(ctx, st)
	if err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	for _, e := range entries {
		if e.Key == tried || (opts.ID != "" && (e.Manifest == nil || e.Manifest.ID != opts.ID)) {
			continue
		}
		if e.Err != nil {
			log.Warn("skipping broken manifest", zap.String("manifest", e.Key), zap.Error(e.Err))
			skipped = append(skipped, fmt.Sprintf("%s: %v", e.Key, e.Err))
			continue
		}
		if r, ok := try(e.Key, e.Manifest); ok {
			return r, nil
		}
		if abort != nil {
			return nil, abort
		}
	}
	if len(skipped) > 0 {
		return nil, fmt.Errorf("%w: %d damaged (%s)", ErrAllDamaged, len(skipped), strings.Join(skipped, "; "))
	}
	if opts.ID != "" {
		return nil, fmt.Errorf("restore %s: %w", opts.ID, ErrNoCheckpoint)
	}
	return nil, ErrNoCheckpoint
}

// restoreOne downloads and verifies one checkpoint into dest/<name>. An
// existing local copy that verifies is reused without downloading.
func restoreOne(ctx context.Context, st cloud.Store, dest, key string, m *Manifest, log *zap.Logger) (*Restored, error) {
	name := path.Base(path.Dir(key))
	final := filepath.Join(dest, name)
	res := &Restored{Dir: final, Key: key, Manifest: m, Bytes: m.Bytes()}
	if err := os.MkdirAll(dest, 0o700); err != nil {
		return nil, err
	}
	if _, err := os.Lstat(final); err == nil {
		if verifyLocal(final, m) == nil {
			log.Info("local copy of checkpoint verified, not downloading", zap.String("dir", final))
			return res, nil
		}
		if err := os.RemoveAll(final); err != nil {
			return nil, err
		}
	}
	tmp, err := os.MkdirTemp(dest, ".partial-"+name+"-")
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(tmp)
		}
	}()
	if err := download(ctx, st, tmp, m, log); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, final); err != nil {
		return nil, err
	}
	ok = true
	return res, nil
}

// download fetches every file of m into dir, verifying size and sha256.
func download(ctx context.Context, st cloud.Store, dir string, m *Manifest, log *zap.Logger) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	p := &progress{start: time.Now(), total: m.Bytes()}
	pctx, stop := context.WithCancel(ctx)
	defer stop()
	go p.report(pctx, log, "restore")
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(4)
	for _, f := range m.Files {
		g.Go(func() error {
			if err := downloadFile(gctx, st, root, f, p); err != nil {
				return fmt.Errorf("%s: %w", f.Path, err)
			}
			return nil
		})
	}
	return g.Wait()
}

// rangedAbove is the size from which a file downloads with parallel ranged
// reads (then is hashed from local disk, still hot in the page cache);
// smaller files stream through the hash in one read.
var rangedAbove int64 = 64 << 20

func downloadFile(ctx context.Context, st cloud.Store, root *os.Root, f File, p *progress) error {
	if d := path.Dir(f.Path); d != "." {
		if err := root.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	out, err := root.OpenFile(f.Path, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	var sum []byte
	if f.Size >= rangedAbove {
		if sum, err = downloadRanged(ctx, st, out, f, p); err != nil {
			return err
		}
	} else {
		r, err := st.Get(ctx, f.Key, 0, -1)
		if err != nil {
			return err
		}
		defer r.Close()
		cr := &countingReader{r: io.LimitReader(r, f.Size+1), h: sha256.New(), p: p}
		if _, err := io.Copy(out, cr); err != nil {
			return err
		}
		if cr.n != f.Size {
			return sizeMismatch(cr.n, f.Size)
		}
		sum = cr.h.Sum(nil)
	}
	if got := hex.EncodeToString(sum); got != f.SHA256 {
		return fmt.Errorf("%w: sha256 %s, manifest says %s", ErrCorrupt, got, f.SHA256)
	}
	return out.Close()
}

// downloadRanged fetches a large object with parallel ranged reads, then
// hashes what landed on disk.
func downloadRanged(ctx context.Context, st cloud.Store, out *os.File, f File, p *progress) ([]byte, error) {
	info, err := st.Stat(ctx, f.Key)
	if err != nil {
		return nil, err
	}
	if info.Size != f.Size {
		return nil, sizeMismatch(info.Size, f.Size)
	}
	if err := cloud.Download(ctx, st, f.Key, f.Size, out, cloud.DownloadOptions{Progress: func(n int64) { p.add(int(n)) }}); err != nil {
		return nil, err
	}
	if _, err := out.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	sum, n, err := sha256Of(out)
	if err != nil {
		return nil, err
	}
	if n != f.Size {
		return nil, sizeMismatch(n, f.Size)
	}
	return sum, nil
}

func sizeMismatch(got, want int64) error {
	return fmt.Errorf("%w: size %d, manifest says %d", ErrCorrupt, got, want)
}

// sha256Of hashes what r holds; n is its length.
func sha256Of(r io.Reader) (sum []byte, n int64, err error) {
	h := sha256.New()
	n, err = io.Copy(h, r)
	return h.Sum(nil), n, err
}

// verifyLocal checks a local copy against the manifest, file by file; a
// file the manifest does not list (say, one a trainer added) fails it too.
func verifyLocal(dir string, m *Manifest) error {
	local, err := scan(dir)
	if err != nil {
		return err
	}
	if len(local) != len(m.Files) {
		return fmt.Errorf("%d files, manifest lists %d", len(local), len(m.Files))
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	for _, f := range m.Files {
		fi, err := root.Lstat(f.Path)
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() || fi.Size() != f.Size {
			return fmt.Errorf("%s: differs", f.Path)
		}
		fh, err := root.Open(f.Path)
		if err != nil {
			return err
		}
		sum, _, err := sha256Of(fh)
		fh.Close()
		if err != nil {
			return err
		}
		if hex.EncodeToString(sum) != f.SHA256 {
			return fmt.Errorf("%s: checksum differs", f.Path)
		}
	}
	return nil
}

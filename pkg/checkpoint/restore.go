package checkpoint

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
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
	// Part, for a job checkpoint (parts.go), restores only the files of
	// that part; "" restores every part's (into one directory, each file
	// at its path). Either way a job checkpoint is restored only when
	// every object of every part exists with its size. A checkpoint
	// without that part (a single-node one) is restored whole.
	Part string
}

// Restored describes a checkpoint copied to local disk and verified.
type Restored struct {
	Dir      string // local directory holding the checkpoint's files
	Key      string // manifest key in the store
	Manifest *Manifest
	Bytes    int64
	Took     time.Duration
	Skipped  []string // manifests tried first and found broken, with why
	Parts    []string // the parts restored, of a job checkpoint; nil: single-node
}

// Restore copies the newest complete checkpoint (or opts.ID) into a new
// directory under dest (created if missing) and verifies every file's size
// and sha256 before it returns. See RestoreInto.
func Restore(ctx context.Context, st cloud.Store, dest string, opts RestoreOptions) (*Restored, error) {
	if err := os.MkdirAll(dest, 0o700); err != nil {
		return nil, err
	}
	root, err := os.OpenRoot(dest)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	return RestoreInto(ctx, st, root, dest, opts)
}

// RestoreInto restores into the directory dest, an open handle on
// destPath: nothing is read, written or deleted outside it, whatever
// symlinks appear there meanwhile.
//
// The newest complete checkpoint is the one with the highest step whose
// manifest validates and whose every file verifies. latest.json is a
// shortcut to it, not the truth: a commit whose latest.json write failed
// leaves a newer complete manifest (manifests are written only after
// their data), so manifests with a higher step than latest.json's are
// tried first. When latest.json is missing, broken or points at a
// damaged checkpoint, the older manifests are tried, newest first, with a
// warning. A checkpoint is only returned once every file verified, and
// its directory only appears (by rename) after that.
func RestoreInto(ctx context.Context, st cloud.Store, dest *os.Root, destPath string, opts RestoreOptions) (*Restored, error) {
	start := time.Now()
	log := opts.Log
	if log == nil {
		log = zap.NewNop()
	}
	var skipped []string
	var abort error // not the checkpoint's fault: the disk, the network, ctx
	tried := map[string]bool{}
	try := func(key string, m *Manifest) (*Restored, bool) {
		if opts.skipEpoch(m) {
			log.Info("skipping a newer session's checkpoint", zap.String("manifest", key), zap.Int64("epoch", m.Epoch))
			return nil, false
		}
		tried[key] = true
		view, parts, err := selectFiles(m, opts.Part, log)
		if err == nil && len(m.Parts) > 0 {
			err = checkParts(ctx, st, m, view)
		}
		var r *Restored
		if err == nil {
			r, err = restoreOne(ctx, st, dest, destPath, key, m, view, log)
		}
		if err == nil {
			r.Parts = parts
		}
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
			abort = fmt.Errorf("restore %s into %s: %w", key, destPath, err)
		}
		return nil, false
	}
	// tryKeys reads the manifests not tried yet and tries them, newest first.
	tryKeys := func(keys []string) (*Restored, bool) {
		var todo []string
		for _, k := range keys {
			if !tried[k] {
				todo = append(todo, k)
			}
		}
		entries, err := readManifests(ctx, st, todo)
		if err != nil {
			abort = fmt.Errorf("restore: %w", err)
			return nil, false
		}
		for _, e := range entries {
			if opts.ID != "" && (e.Manifest == nil || e.Manifest.ID != opts.ID) {
				continue
			}
			if e.Err != nil {
				tried[e.Key] = true
				log.Warn("skipping broken manifest", zap.String("manifest", e.Key), zap.Error(e.Err))
				skipped = append(skipped, fmt.Sprintf("%s: %v", e.Key, e.Err))
				continue
			}
			if r, ok := try(e.Key, e.Manifest); ok || abort != nil {
				return r, ok
			}
		}
		return nil, false
	}
	keys, listErr := listManifestKeys(ctx, st)
	if opts.ID == "" {
		l, err := ReadLatest(ctx, st)
		switch {
		case err == nil:
			var newer []string
			for _, k := range keys {
				if stepOf(dirOf(k)) > l.Step {
					newer = append(newer, k)
				}
			}
			if len(newer) > 0 {
				log.Warn("manifests newer than latest.json: trying them first", zap.Int64("latest_step", l.Step), zap.Int("newer", len(newer)))
				if r, ok := tryKeys(newer); ok || abort != nil {
					return r, abort
				}
			}
			if tried[l.Manifest] {
				break
			}
			m, err := ReadManifest(ctx, st, l.Manifest)
			if err == nil {
				if r, ok := try(l.Manifest, m); ok || abort != nil {
					return r, abort
				}
			} else {
				tried[l.Manifest] = true
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
	if listErr != nil {
		return nil, fmt.Errorf("restore: %w", listErr)
	}
	if r, ok := tryKeys(keys); ok || abort != nil {
		return r, abort
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
// Only the files view lists are fetched (m, or a part of it).
func restoreOne(ctx context.Context, st cloud.Store, dest *os.Root, destPath, key string, m, view *Manifest, log *zap.Logger) (*Restored, error) {
	name := path.Base(path.Dir(key))
	final := filepath.Join(destPath, name)
	res := &Restored{Dir: final, Key: key, Manifest: m, Bytes: view.Bytes()}
	if _, err := dest.Lstat(name); err == nil {
		if verifyLocal(dest, name, view) == nil {
			log.Info("local copy of checkpoint verified, not downloading", zap.String("dir", final))
			return res, nil
		}
		if err := dest.RemoveAll(name); err != nil {
			return nil, err
		}
	}
	tmp, err := MkdirTemp(dest, ".partial-"+name+"-")
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			dest.RemoveAll(tmp)
		}
	}()
	dir, err := OpenDir(dest, tmp)
	if err != nil {
		return nil, err
	}
	err = download(ctx, st, dir, view, log)
	dir.Close()
	if err != nil {
		return nil, err
	}
	if err := dest.Rename(tmp, name); err != nil {
		return nil, err
	}
	ok = true
	return res, nil
}

// MkdirTemp creates a new directory prefix+random below root (0700) and
// returns its name: os.MkdirTemp through a root.
func MkdirTemp(root *os.Root, prefix string) (string, error) {
	for range 100 {
		var b [6]byte
		rand.Read(b[:])
		name := prefix + hex.EncodeToString(b[:])
		err := root.Mkdir(name, 0o700)
		if err == nil {
			return name, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return "", err
		}
	}
	return "", fmt.Errorf("mkdir %s*: %w", prefix, fs.ErrExist)
}

// download fetches every file of m into dir, verifying size and sha256.
func download(ctx context.Context, st cloud.Store, root *os.Root, m *Manifest, log *zap.Logger) error {
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

// verifyLocal checks the local copy dir (below parent) against the
// manifest, file by file; a file the manifest does not list (say, one a
// trainer added) fails it too, and so does a symlink anywhere in it.
func verifyLocal(parent *os.Root, dir string, m *Manifest) error {
	root, err := OpenDir(parent, dir)
	if err != nil {
		return err
	}
	defer root.Close()
	local, err := scan(root)
	if err != nil {
		return err
	}
	if len(local) != len(m.Files) {
		return fmt.Errorf("%d files, manifest lists %d", len(local), len(m.Files))
	}
	for _, f := range m.Files {
		fh, err := openRegular(root, f.Path, f.Size)
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

// skipEpoch reports whether restore must pass over m: it was committed by
// a newer session than the one restoring (which that session fenced).
func (o RestoreOptions) skipEpoch(m *Manifest) bool {
	return o.MaxEpoch > 0 && m.Epoch > o.MaxEpoch
}

// Package restore copies the newest complete checkpoint a store holds (or
// one named) to local disk, verifying every file, and only then makes it
// appear: Checkpoint into a new directory, Into through an open root, Dir
// in place of a directory. It passes over fenced sessions' checkpoints and
// falls back past damaged ones; nearer tiers serve files, never the
// choice.
package restore

// Which checkpoint is restored and which of its files: the newest complete
// one that is not a fenced session's (or the one named), falling back past
// damaged ones; a multi-node job's part selected and its parts checked;
// each file verified before the directory appears; then where each file's
// bytes come from (the tiers, the store, the stall watchdog).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// ErrNoCheckpoint means the store holds no committed checkpoint: a run
// starts fresh.
var ErrNoCheckpoint = errors.New("no complete checkpoint")

// ErrAllDamaged means checkpoints were committed but none verifies. A run
// must not start fresh over them: a person decides.
var ErrAllDamaged = errors.New("no committed checkpoint verifies")

// Options tunes Restore.
type Options struct {
	ID  string // restore this checkpoint only; empty: the newest complete one
	Log *zap.Logger
	// MaxEpoch > 0 passes over checkpoints committed under a higher epoch:
	// a newer session's, which fenced the one restoring (pkg/checkpoint, latest.go).
	MaxEpoch int64
	// Part, for a job checkpoint (pkg/checkpoint, manifest.go), restores only the files of
	// that part; "" restores every part's (into one directory, each file
	// at its path). Either way a job checkpoint is restored only when
	// every object of every part exists with its size. A checkpoint
	// without that part (a single-node one) is restored whole.
	Part string
	// Stall fails a store request that makes no progress (no answer, no
	// byte of its body) for this long; 0: defaultStall, < 0: never.
	Stall time.Duration
	// Tiers are copies nearer than the store, nearest first (tier.go):
	// asked for each file of the checkpoint chosen, never for the choice.
	Tiers []checkpoint.Tier
}

// Result describes a checkpoint copied to local disk and verified.
type Result struct {
	Dir      string // local directory holding the checkpoint's files
	Key      string // manifest key in the store
	Manifest *checkpoint.Manifest
	Bytes    int64
	Took     time.Duration
	Skipped  []string // manifests tried first and found broken, with why
	Parts    []string // the parts restored, of a job checkpoint; nil: single-node
	// From is the bytes restored from each source: a tier's name, or
	// FromStore.
	From map[string]int64
}

// Restore copies the newest complete checkpoint (or opts.ID) into a new
// directory under dest (created if missing) and verifies every file's size
// and checksum before it returns. See Into.
func Checkpoint(ctx context.Context, st cloud.Store, dest string, opts Options) (*Result, error) {
	if err := os.MkdirAll(dest, 0o700); err != nil {
		return nil, err
	}
	root, err := os.OpenRoot(dest)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	return Into(ctx, st, root, dest, opts)
}

// Into restores into the directory dest, an open handle on
// destPath: nothing is read, written or deleted outside it, whatever
// symlinks appear there meanwhile.
//
// The newest complete checkpoint is the one with the highest step whose
// manifest validates and whose every file verifies. latest.json is a
// shortcut to it, not the truth: a commit whose latest.json write failed
// leaves a newer complete manifest (manifests are written only after
// their data), so manifests with a higher step than the one latest.json
// points at are tried first, except those committed under a lower epoch
// than latest.json's (every one, when a seal left latest.json without a
// pointer): a fenced session's, committed after a newer session sealed
// latest.json (the seal adopts every checkpoint committed before it,
// pkg/checkpoint, latest.go). The step latest.json points at is its manifest's (the
// key names it), whatever its "step" field says. When latest.json is
// missing, broken or points at a damaged checkpoint, the older manifests
// are tried, newest first, with a warning. Manifests are read one at a
// time (each bounded in size), newest first, and only until one restores:
// a store of many large manifests costs the memory of one. A checkpoint
// is only returned once every file verified, and its directory only
// appears (by rename) after that.
func Into(ctx context.Context, st cloud.Store, dest *os.Root, destPath string, opts Options) (*Result, error) {
	return WithFetch(ctx, st, opts, destPath, func(ctx context.Context, st cloud.Store, key string, m, view *checkpoint.Manifest, log *zap.Logger) (*Result, error) {
		return restoreOne(ctx, st, dest, destPath, key, &sources{m: m, tiers: opts.Tiers, log: log}, view)
	})
}

// Fetch copies the files view lists (of manifest m, at key) and
// verifies them: restoreOne, or the simulation's check in memory.
type Fetch func(ctx context.Context, st cloud.Store, key string, m, view *checkpoint.Manifest, log *zap.Logger) (*Result, error)

// WithFetch chooses the checkpoint as Into describes and copies it
// with fetch (destPath names the destination in errors).
func WithFetch(ctx context.Context, st cloud.Store, opts Options, destPath string, fetch Fetch) (*Result, error) {
	r := &restorer{ctx: ctx, opts: opts, log: opts.Log, fetch: fetch, destPath: destPath, start: time.Now(), pointerStep: -1}
	if r.log == nil {
		r.log = zap.NewNop()
	}
	if r.opts.Stall == 0 {
		r.opts.Stall = defaultStall
	}
	r.st = withStall(st, r.opts.Stall)
	keys, listErr := checkpoint.ListManifestKeys(ctx, r.st)
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	if opts.ID == "" {
		if err := r.readPointer(); err != nil {
			return nil, err
		}
	}
	if listErr != nil {
		if r.pointer == "" {
			return nil, fmt.Errorf("restore: %w", listErr)
		}
		keys = nil // latest.json's checkpoint alone, then the error
	}
	if res, done, err := r.walk(restoreOrder(keys, r.pointer, r.pointerStep, opts.ID)); done {
		return res, err
	}
	if listErr != nil {
		return nil, fmt.Errorf("restore: %w", listErr)
	}
	if len(r.skipped) > 0 {
		return nil, fmt.Errorf("%w: %d damaged (%s)", ErrAllDamaged, len(r.skipped), strings.Join(r.skipped, "; "))
	}
	if opts.ID != "" {
		return nil, fmt.Errorf("restore %s: %w", opts.ID, ErrNoCheckpoint)
	}
	return nil, ErrNoCheckpoint
}

// restorer is one restore's state: what latest.json says, what was skipped.
type restorer struct {
	ctx      context.Context
	st       cloud.Store
	opts     Options
	log      *zap.Logger
	fetch    Fetch
	destPath string
	start    time.Time

	pointer     string // the manifest latest.json points at
	pointerStep int64  // its step; -1: none
	floor       int64  // latest.json's epoch: older epochs above the pointer are fenced
	newerWarned bool
	skipped     []string
	abort       error // not the checkpoint's fault: the disk, the network, ctx
}

// readPointer reads latest.json: its pointer and epoch, if any.
func (r *restorer) readPointer() error {
	l, err := checkpoint.ReadLatestSealed(r.ctx, r.st)
	switch {
	case err == nil && l.Manifest == "": // sealed before any commit: it fences all the same
		r.floor = l.Epoch
	case err == nil:
		r.pointer, r.floor = l.Manifest, l.Epoch
		if r.pointerStep = l.PointsAt(); r.pointerStep != l.Step {
			r.log.Warn("latest.json's step disagrees with the manifest it points at: trusting the manifest (the next commit repairs latest.json)",
				zap.String("manifest", l.Manifest), zap.Int64("latest_step", l.Step), zap.Int64("manifest_step", r.pointerStep))
		}
	case r.ctx.Err() != nil:
		return r.ctx.Err()
	case errors.Is(err, cloud.ErrNotExist):
	default:
		r.log.Warn("latest.json unreadable, falling back to listing", zap.Error(err))
	}
	return nil
}

// walk tries the manifests in order, one step at a time, until one
// restores (done) or something that is not a checkpoint's fault stops it
// (done, with the error).
func (r *restorer) walk(order []string) (*Result, bool, error) {
	freed := false
	for i := 0; i < len(order); {
		// One step at a time: usually one manifest; several of one step
		// (two sessions) are ordered by creation, newest first.
		j := i + 1
		for j < len(order) && order[i] != r.pointer && order[j] != r.pointer && checkpoint.StepOf(checkpoint.DirOf(order[j])) == checkpoint.StepOf(checkpoint.DirOf(order[i])) {
			j++
		}
		group := order[i:j]
		i = j
		if freed {
			// The previous manifest was large and did not restore: give
			// its memory back before the next is read, so that a store of
			// many large manifests costs the memory of one.
			debug.FreeOSMemory()
			freed = false
		}
		entries, err := r.readGroup(group)
		if err != nil {
			return nil, true, err
		}
		for _, e := range entries {
			if !r.eligible(e) {
				continue
			}
			if res, ok := r.try(e.Key, e.Manifest); ok || r.abort != nil {
				return res, true, r.abort
			}
			freed = freed || len(e.Manifest.Files) >= bigManifest
		}
	}
	return nil, false, nil
}

// readGroup reads the manifests of one step, newest first.
func (r *restorer) readGroup(group []string) ([]checkpoint.Entry, error) {
	entries := make([]checkpoint.Entry, 0, len(group))
	for _, k := range group {
		m, err := checkpoint.ReadManifest(r.ctx, r.st, k)
		if r.ctx.Err() != nil {
			return nil, r.ctx.Err()
		}
		if err != nil && !checkpoint.ManifestDamaged(err) {
			// The store failed to answer (stalled, or an error once its
			// retries ran out), not the manifest: passing over it would
			// restore an older checkpoint than the newest committed.
			return nil, fmt.Errorf("restore: %w", err)
		}
		entries = append(entries, checkpoint.Entry{Key: k, Manifest: m, Err: err})
	}
	sort.SliceStable(entries, func(a, b int) bool { return checkpoint.Newer(entries[a], entries[b]) })
	return entries, nil
}

// eligible reports whether restore tries e: a readable manifest, of the
// checkpoint asked for, not a fenced session's (above latest.json's
// pointer under an older epoch than latest.json's).
func (r *restorer) eligible(e checkpoint.Entry) bool {
	switch {
	case e.Err != nil && e.Key == r.pointer:
		r.log.Warn("latest.json points at a broken manifest", zap.String("manifest", e.Key), zap.Error(e.Err))
		r.skipped = append(r.skipped, fmt.Sprintf("%s: %v", e.Key, e.Err))
		return false
	case e.Err != nil:
		r.log.Warn("skipping broken manifest", zap.String("manifest", e.Key), zap.Error(e.Err))
		r.skipped = append(r.skipped, fmt.Sprintf("%s: %v", e.Key, e.Err))
		return false
	case r.opts.ID != "" && e.Manifest.ID != r.opts.ID:
		return false
	}
	if e.Manifest.Step <= r.pointerStep {
		return true
	}
	if e.Manifest.Epoch < r.floor {
		r.log.Info("skipping a fenced session's checkpoint: committed under an older epoch than latest.json's, above the checkpoint its seal adopted",
			zap.String("manifest", e.Key), zap.Int64("epoch", e.Manifest.Epoch), zap.Int64("latest_epoch", r.floor))
		return false
	}
	if r.pointer != "" && !r.newerWarned {
		r.newerWarned = true
		r.log.Warn("manifests newer than latest.json: trying them first", zap.Int64("latest_step", r.pointerStep))
	}
	return true
}

// try restores the checkpoint of manifest m (at key): true once it did.
// A damaged one is recorded and false; anything else sets r.abort.
func (r *restorer) try(key string, m *checkpoint.Manifest) (*Result, bool) {
	log := r.log
	if r.opts.skipEpoch(m) {
		log.Info("skipping a newer session's checkpoint", zap.String("manifest", key), zap.Int64("epoch", m.Epoch))
		return nil, false
	}
	view, parts, err := selectFiles(m, r.opts.Part, log)
	if err == nil && len(m.Parts) > 0 {
		err = checkParts(r.ctx, r.st, m, view)
	}
	var res *Result
	if err == nil {
		// A long restore logs its progress (bytes, rate, eta) every 5 s.
		log.Info("restoring checkpoint", zap.String("manifest", key), zap.Int64("step", m.Step),
			zap.Int("files", len(view.Files)), zap.Int64("bytes", view.Bytes()))
		res, err = r.fetch(r.ctx, r.st, key, m, view, log)
	}
	switch {
	case err == nil:
		res.Parts = parts
		res.Took, res.Skipped = time.Since(r.start), r.skipped
		return res, true
	case r.ctx.Err() != nil:
		r.abort = r.ctx.Err()
	case errors.Is(err, checkpoint.ErrCorrupt) || errors.Is(err, cloud.ErrNotExist):
		log.Warn("checkpoint damaged, trying an older one", zap.String("manifest", key), zap.Error(err))
		r.skipped = append(r.skipped, fmt.Sprintf("%s: %v", key, err))
	default:
		// An older checkpoint would fail the same way, and giving up
		// on all of them would make the run start from scratch.
		r.abort = fmt.Errorf("restore %s into %s: %w", key, r.destPath, err)
	}
	return nil, false
}

// bigManifest is the number of files from which a manifest that did not
// restore has its memory returned before the next one is read.
const bigManifest = 20000

// restoreOrder is the order in which restore tries the manifests at keys:
// newest first by the step their key names, the one latest.json points at
// (pointer, of step pointerStep) first among those of its step, and only
// those of checkpoint id when id is set.
func restoreOrder(keys []string, pointer string, pointerStep int64, id string) []string {
	order := make([]string, 0, len(keys)+1)
	for _, k := range keys {
		if k == pointer {
			continue
		}
		if id != "" && !strings.HasSuffix(strings.TrimSuffix(checkpoint.DirOf(k), "/"), "-"+id) {
			continue
		}
		order = append(order, k)
	}
	sort.Slice(order, func(i, j int) bool {
		si, sj := checkpoint.StepOf(checkpoint.DirOf(order[i])), checkpoint.StepOf(checkpoint.DirOf(order[j]))
		if si != sj {
			return si > sj
		}
		return order[i] > order[j]
	})
	if pointer != "" {
		at := sort.Search(len(order), func(i int) bool { return checkpoint.StepOf(checkpoint.DirOf(order[i])) <= pointerStep })
		order = slices.Insert(order, at, pointer)
	}
	return order
}

// restoreOne downloads and verifies one checkpoint into dest/<name>. An
// existing local copy that verifies is reused without downloading.
// Only the files view lists are fetched (m, or a part of it).
func restoreOne(ctx context.Context, st cloud.Store, dest *os.Root, destPath, key string, src *sources, view *checkpoint.Manifest) (*Result, error) {
	name := path.Base(path.Dir(key))
	final := filepath.Join(destPath, name)
	log := src.log
	res := &Result{Dir: final, Key: key, Manifest: src.m, Bytes: view.Bytes()}
	if _, err := dest.Lstat(name); err == nil {
		err := verifyLocal(dest, name, view)
		if err == nil {
			log.Info("local copy of checkpoint verified, not downloading", zap.String("dir", final))
			res.From = map[string]int64{checkpoint.FromLocal: res.Bytes}
			return res, nil
		}
		log.Info("local copy of checkpoint not reused: restoring it again", zap.String("dir", final), zap.Error(err))
		if err := dest.RemoveAll(name); err != nil {
			return nil, err
		}
	}
	tmp, err := checkpoint.MkdirTemp(dest, ".partial-"+name+"-")
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			dest.RemoveAll(tmp)
		}
	}()
	dir, err := checkpoint.OpenDir(dest, tmp)
	if err != nil {
		return nil, err
	}
	err = download(ctx, st, dir, view, src)
	dir.Close()
	if err != nil {
		return nil, err
	}
	if err := dest.Rename(tmp, name); err != nil {
		return nil, err
	}
	ok = true
	res.From = src.from()
	return res, nil
}

// download fetches every file of m into dir, verifying size and checksum.
func download(ctx context.Context, st cloud.Store, root *os.Root, m *checkpoint.Manifest, src *sources) error {
	log := src.log
	p := &checkpoint.Progress{Start: time.Now(), Total: m.Bytes()}
	pctx, stop := context.WithCancel(ctx)
	defer stop()
	go p.Report(pctx, log, "restore")
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(4)
	// No file starts more than aheadMax files after one still running:
	// a failure stops the restore within that many files however the
	// goroutines are scheduled (small files are fetched and verified in
	// microseconds, faster than a failing one may get to report).
	done := make([]chan struct{}, len(m.Files))
	for i, f := range m.Files {
		if i >= aheadMax {
			select {
			case <-done[i-aheadMax]:
			case <-gctx.Done():
			}
		}
		if gctx.Err() != nil {
			break // a file failed (or ctx ended): create no more
		}
		done[i] = make(chan struct{})
		g.Go(func() error {
			defer close(done[i])
			if err := gctx.Err(); err != nil {
				return err // g.Wait returns the first error, the cause
			}
			if err := downloadFile(gctx, st, root, f, p, src); err != nil {
				return fmt.Errorf("%s: %w", f.Path, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	return ctx.Err() // ended before any file failed: not every file is there
}

// aheadMax bounds how far the restore of a checkpoint's files runs ahead of
// the earliest one still being fetched.
const aheadMax = 16

// rangedAbove is the size from which a file downloads with parallel ranged
// reads (then is hashed from local disk, still hot in the page cache);
// smaller files stream through the hash in one read.
var rangedAbove int64 = 64 << 20

func downloadFile(ctx context.Context, st cloud.Store, root *os.Root, f checkpoint.File, p *checkpoint.Progress, src *sources) error {
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
	near, err := src.fromTiers(ctx, out, f, p)
	switch {
	case err != nil:
		return err
	case near:
		return out.Close()
	case f.Size >= rangedAbove:
		err = downloadRanged(ctx, st, out, f, p)
	default:
		err = getVerified(ctx, st, out, f, p)
	}
	if err == nil {
		err = out.Close()
	}
	if err == nil {
		src.add(checkpoint.FromStore, f.Size)
	}
	return err
}

// getVerified fetches f from the store into out in one read.
func getVerified(ctx context.Context, st cloud.Store, out io.Writer, f checkpoint.File, p *checkpoint.Progress) error {
	r, err := st.Get(ctx, f.Key, 0, -1)
	if err != nil {
		return err
	}
	defer r.Close()
	return copyVerified(out, r, f, p)
}

// copyVerified copies r to out, checking what passes against f's size and
// checksum.
func copyVerified(out io.Writer, r io.Reader, f checkpoint.File, p *checkpoint.Progress) error {
	return checkpoint.CopyVerified(out, r, f, p)
}

// downloadRanged fetches a large object with parallel ranged reads and
// verifies what it wrote to disk.
func downloadRanged(ctx context.Context, st cloud.Store, out *os.File, f checkpoint.File, p *checkpoint.Progress) error {
	info, err := st.Stat(ctx, f.Key)
	if err != nil {
		return err
	}
	if info.Size != f.Size {
		return checkpoint.SizeMismatch(info.Size, f.Size)
	}
	cw := checkpoint.NewCRCWriterAt(out)
	if err := cloud.Download(ctx, st, f.Key, f.Size, cw, cloud.DownloadOptions{Progress: func(n int64) { p.Add(int(n)) }}); err != nil {
		return err
	}
	// The CRC32C of what was written, range by range, spares reading the
	// file back (a copy of every byte); a sha256 manifest, or writes that
	// did not cover the file exactly once, are verified from disk.
	if crc, ok := cw.Sum(f.Size); ok && f.CRC32C != "" {
		if got := checkpoint.CRC32CHex(crc); got != f.CRC32C {
			return fmt.Errorf("%w: crc32c %s, manifest says %s", checkpoint.ErrCorrupt, got, f.CRC32C)
		}
		return nil
	}
	if _, err := out.Seek(0, io.SeekStart); err != nil {
		return err
	}
	return f.Verify(out)
}

// verifyLocal checks the local copy dir (below parent) against the
// manifest's sizes and digests, file by file; a file the manifest does
// not list (say, one a trainer added) fails it too, and so does a symlink
// anywhere in it, or a file whose entry records no digest (a CRC32C is
// no proof: it is forged with four bytes).
func verifyLocal(parent *os.Root, dir string, m *checkpoint.Manifest) error {
	root, err := checkpoint.OpenDir(parent, dir)
	if err != nil {
		return err
	}
	defer root.Close()
	local, err := checkpoint.Scan(root)
	if err != nil {
		return err
	}
	if len(local) != len(m.Files) {
		return fmt.Errorf("%d files, manifest lists %d", len(local), len(m.Files))
	}
	for _, f := range m.Files {
		fh, err := checkpoint.OpenScanned(root, f.Path, f.Size)
		if err != nil {
			return err
		}
		err = f.VerifyDigest(fh)
		fh.Close()
		if errors.Is(err, checkpoint.ErrCorrupt) {
			return fmt.Errorf("%s: digest differs", f.Path)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// skipEpoch reports whether restore must pass over m: it was committed by
// a newer session than the one restoring (which that session fenced).
func (o Options) skipEpoch(m *checkpoint.Manifest) bool {
	return o.MaxEpoch > 0 && m.Epoch > o.MaxEpoch
}

// ErrNoPart means the newest checkpoint of a job has no part of the node
// restoring it: restore fails rather than hand that node another node's
// files.
var ErrNoPart = errors.New("no part for this node:")

// ErrPathClash means two parts of a job checkpoint hold different files
// at one path, so they cannot be restored into one directory: restore one
// part at a time (Options.Part).
var ErrPathClash = errors.New("parts hold different files at one path")

// selectFiles returns the manifest restore fetches for part ("": every
// part) and the parts it holds. Every part into one directory: a path in
// several parts must be the same file in each (it is fetched once).
func selectFiles(m *checkpoint.Manifest, part string, log *zap.Logger) (*checkpoint.Manifest, []string, error) {
	if len(m.Parts) == 0 {
		if part != "" {
			log.Warn("checkpoint has no parts: restoring all of it", zap.String("id", m.ID), zap.String("part", part))
		}
		return m, nil, nil
	}
	view := *m
	view.Files = nil
	var parts []string
	if part != "" {
		if m.Part(part) == nil {
			// Another node's files are not this node's state: resuming
			// from them would mix ranks. A changed topology restores
			// every part on purpose (Options.Part "").
			var have []string
			for _, p := range m.Parts {
				have = append(have, p.Node)
			}
			return nil, nil, fmt.Errorf("checkpoint %d-%s has parts %v: %w %s (to restore every part, as after a change of topology, use --restore all)",
				m.Step, m.ID, have, ErrNoPart, part)
		}
		parts = []string{part}
	}
	byPath := map[string]checkpoint.File{}
	for _, f := range m.Files {
		if part != "" && f.Part != part {
			continue
		}
		if prev, ok := byPath[f.Path]; ok {
			if !prev.SameContent(f) {
				return nil, nil, fmt.Errorf("%q in parts %s and %s: %w", f.Path, prev.Part, f.Part, ErrPathClash)
			}
			continue
		}
		byPath[f.Path] = f
		view.Files = append(view.Files, f)
	}
	if part == "" {
		for _, p := range m.Parts {
			parts = append(parts, p.Node)
		}
	}
	// One directory: a path that is another part's directory cannot be laid out.
	flat := make([]checkpoint.File, len(view.Files))
	for i, f := range view.Files {
		flat[i] = f
		flat[i].Part = ""
	}
	if err := checkpoint.ValidateFiles(flat); err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrPathClash, err)
	}
	return &view, parts, nil
}

// checkParts makes sure every object of m that restore does not fetch
// (view lists those it does, and verifies them as it goes) exists with its
// size: a job checkpoint with a part missing or cut short is not complete.
// Such a checkpoint is ErrCorrupt or cloud.ErrNotExist, as a damaged one.
func checkParts(ctx context.Context, st cloud.Store, m, view *checkpoint.Manifest) error {
	fetched := map[string]bool{}
	for _, f := range view.Files {
		fetched[f.Key] = true
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for _, f := range m.Files {
		if fetched[f.Key] {
			continue
		}
		g.Go(func() error {
			info, err := st.Stat(gctx, f.Key)
			if err != nil {
				return fmt.Errorf("part %s: %s: %w", f.Part, f.Path, err)
			}
			if info.Size != f.Size {
				return fmt.Errorf("part %s: %s: %w", f.Part, f.Path, checkpoint.SizeMismatch(info.Size, f.Size))
			}
			return nil
		})
	}
	return g.Wait()
}

// Where each restored file's bytes come from: the nearer tiers first (a
// copy refused once is not asked again), else the store, whose requests a
// watchdog fails when they stall.

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

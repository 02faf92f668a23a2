package commit

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// A Pipeline uploads the files of one checkpoint as the trainer reports
// them complete (protocol `saved`), before the checkpoint is done: notice
// → committed then costs max(save, upload) instead of their sum. It only
// moves data objects; Commit, at done, decides what the manifest lists.
//
// Nothing a Pipeline uploads is trusted on its own. Each file is opened
// through the request's os.Root handle (never by a path the trainer could
// swap), O_NOFOLLOW and O_NONBLOCK, and must be a regular file; its
// identity (device and inode, size, mtime, ctime) is taken from the open
// descriptor before and after it is streamed. At done, Commit scans the
// directory as it always does, and a piped upload stands for a file only
// if the file's identity is unchanged since then; anything else (written
// after `saved`, replaced, changed while it was read, a failed upload) is
// uploaded again like a file nobody announced. A file modified within the
// file system's timestamp granularity of its last write ("racily clean",
// as git calls it) would keep its mtime: such a file is hashed again
// locally at done, and re-uploaded if the hash differs.
type Pipeline struct {
	c         *Committer
	root      *os.Root
	prefix    string
	parent    context.Context // NewPipeline's: bounds the deletion too
	parentEnd *endWatch       // when parent ended (deleteUnused)
	ctx       context.Context
	cancel    context.CancelFunc
	sem       chan struct{}
	wg        sync.WaitGroup // uploads
	bg        sync.WaitGroup // uploads and the deletion after them (Wait)
	lazy      bool           // with a Gate, or deferred: validate only, upload at done
	pace      pipePace       // what its uploads tell the committer's pace
	p         *checkpoint.Progress
	log       *zap.Logger

	mu    sync.Mutex
	files map[string]*pipedFile
	first time.Time // first upload started
	used  bool      // handed to a Commit: no more Add
	clean sync.Once // deletes what no manifest lists, once

	// refused is the first file Add refused as not the trainer's own
	// (ErrNotOwned): the checkpoint fails at done.
	refused error
}

// pipePace is what a pipeline tells the committer's choice of early
// uploads (pace.go).
type pipePace struct {
	// scored: the choice this pipeline is a measure of; false once a Gate
	// or Halt decided instead.
	scored bool
	early  bool      // the choice
	born   time.Time // first file reported saved
}

type pipedFile struct {
	rel   string
	key   string
	size  int64
	ident checkpoint.FileIdent // after the upload
	racy  bool
	sum   string // CRC32C
	dig   string // digest
	err   error  // nil: uploaded, and unchanged while read
	// started: an upload ran (it may have put an object)
	started bool
}

var errNotEarly = errors.New("not uploaded early")

// ErrDuplicate reports a file announced twice for one checkpoint.
var ErrDuplicate = errors.New("already reported saved")

// racyWindow is how close to the moment it is opened a file's mtime may
// be before an unchanged mtime stops proving an unchanged file: Linux
// stamps files from a coarse clock (one tick, up to 10 ms).
const racyWindow = 50 * time.Millisecond

// NewPipeline starts a pipeline for the checkpoint (step, id) held open as
// root, which the caller keeps open until the pipeline is committed or
// aborted. step names the objects' prefix: the step the trainer expects to
// report in done (a done with another step still commits, its manifest
// pointing at these keys). With a Gate (node mode) uploads wait for done,
// where the gate orders them; Add still checks each file. Cancelling ctx
// stops the uploads and the deletion of what they put; Wait then returns
// soon.
func (c *Committer) NewPipeline(ctx context.Context, root *os.Root, step int64, id string) *Pipeline {
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	p := &Pipeline{
		c: c, root: root, prefix: checkpoint.Prefix(max(step, 0), id), parent: parent, ctx: ctx, cancel: cancel,
		sem: make(chan struct{}, c.concurrency()), lazy: c.Gate != nil,
		files: map[string]*pipedFile{}, p: &checkpoint.Progress{Start: time.Now()},
		log: c.log().With(zap.String("id", id)),
	}
	p.parentEnd = watchEnd(parent)
	if !p.lazy {
		p.pace.scored, p.pace.early = true, c.paceState().early()
		p.lazy = !p.pace.early
		if !p.pace.early {
			p.log.Debug("early uploads deferred to done: they were slower than the serial path here")
		}
	}
	return p
}

// score reports the pipeline's time to durable data to the committer's
// pace, unless something other than the pace decided its uploads.
func (p *Pipeline) score(bytes int64, uploaded time.Time) {
	p.mu.Lock()
	scored, born := p.pace.scored, p.pace.born
	p.mu.Unlock()
	if scored && !born.IsZero() {
		p.c.paceState().record(p.pace.early, bytes, uploaded.Sub(born))
	}
}

// Add starts uploading rel (relative to the checkpoint directory,
// "/"-separated). It fails at once, uploading nothing, for an unsafe or
// duplicate path, a missing file, or anything but a regular file.
//
// owners, when given, are the uids of the trainer that reported rel, one
// of another user than the agent's: the file must be owned by one of them
// and have a single link (checkpoint.CheckOwnedBy, which the commit
// applies at done through Request.Owners). A file that is not is never
// read, and fails the checkpoint: it stops the uploads in flight, every
// later Add fails, and so does the Commit that takes p, so that nothing of
// it is committed.
func (p *Pipeline) Add(rel string, owners ...int) error {
	if err := checkpoint.SafeRel(rel); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.used {
		return errors.New("checkpoint already done")
	}
	if p.refused != nil {
		return fmt.Errorf("checkpoint refused: %w", p.refused)
	}
	if p.ctx.Err() != nil && !p.lazy {
		return errors.New("checkpoint abandoned")
	}
	if _, dup := p.files[rel]; dup {
		return fmt.Errorf("%s: %w", rel, ErrDuplicate)
	}
	fh, err := p.root.OpenFile(rel, os.O_RDONLY|checkpoint.ONonblock|checkpoint.ONoFollow, 0)
	if err != nil {
		return err
	}
	info, err := fh.Stat()
	if err == nil {
		err = checkpoint.CheckRegular(p.root, rel, fh, info.Size())
	}
	if err == nil && len(owners) > 0 {
		if err = checkpoint.CheckOwnedBy(rel, info, owners); err != nil {
			p.refused = err
			p.cancel()
		}
	}
	if err != nil {
		fh.Close()
		return err
	}
	f := &pipedFile{rel: rel, key: p.prefix + rel, size: info.Size()}
	p.files[rel] = f
	if p.pace.born.IsZero() {
		p.pace.born = time.Now()
	}
	if p.lazy {
		fh.Close()
		f.err = errNotEarly
		return nil
	}
	f.started = true
	if p.first.IsZero() {
		p.first = time.Now()
	}
	p.wg.Add(1)
	p.bg.Add(1)
	go func() {
		defer p.bg.Done()
		defer p.wg.Done()
		defer fh.Close()
		p.upload(fh, info, f)
		if f.err != nil && p.ctx.Err() == nil {
			p.log.Warn("early upload failed: the file is uploaded again at done", zap.String("path", rel), zap.Error(f.err))
		}
	}()
	return nil
}

// Uploading reports whether an early upload began: p is not lazy (halted,
// deferred by the pace, or a node agent's) and a file was added.
func (p *Pipeline) Uploading() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.first.IsZero()
}

// upload streams fh to the store. Only this goroutine writes f until
// wg.Wait returns.
func (p *Pipeline) upload(fh *os.File, before os.FileInfo, f *pipedFile) {
	// A file read within racyWindow of its last change could change again
	// without its mtime or ctime moving, and would be read once more at
	// done to prove it did not: waiting out the rest of the window (a
	// trainer reports saved right after its last write) costs less. It is
	// waited before taking an upload slot, which it would hold idle.
	if d := time.Until(checkpoint.ChangeTime(before).Add(racyWindow)); d > 0 && d <= racyWindow {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-p.ctx.Done():
			t.Stop()
			f.err = p.ctx.Err()
			return
		}
	}
	select {
	case p.sem <- struct{}{}:
		defer func() { <-p.sem }()
	case <-p.ctx.Done():
		f.err = p.ctx.Err()
		return
	}
	opened := time.Now()
	ur := newUploadReader(fh, f.size, p.p)
	if err := p.c.Store.Put(p.ctx, f.key, ur, f.size, cloud.PutOptions{}); err != nil {
		f.err = err
		return
	}
	n, sum, dig, err := ur.result()
	if err != nil {
		f.err = err
		return
	}
	after, err := fh.Stat()
	switch {
	case err != nil:
		f.err = err
	case n != f.size || checkpoint.IdentOf(after) != checkpoint.IdentOf(before):
		f.err = errors.New("file changed while it was uploaded")
	}
	f.ident = checkpoint.IdentOf(after)
	f.racy = !checkpoint.ChangeTime(after).Before(opened.Add(-racyWindow))
	f.sum, f.dig = sum, dig
}

// Halt stops the uploads in flight without deleting anything; files
// reported from now on are only checked. What was not uploaded is
// uploaded at done.
func (p *Pipeline) Halt() {
	p.mu.Lock()
	p.lazy, p.pace.scored = true, false
	p.mu.Unlock()
	p.cancel()
}

// Abort stops the uploads and deletes what they put, in the background:
// the checkpoint will not be committed. Safe to call more than once, and
// after a Commit that used the pipeline (it then does nothing).
func (p *Pipeline) Abort() {
	p.mu.Lock()
	p.used = true
	p.mu.Unlock()
	p.cancel()
	p.clean.Do(func() {
		p.bg.Add(1)
		go func() {
			defer p.bg.Done()
			p.wg.Wait()
			p.deleteUnused(nil)
		}()
	})
}

// Wait returns once the uploads and the deletion Abort or a commit started
// have ended. Call it after Abort, or after the Commit that used p.
func (p *Pipeline) Wait() { p.bg.Wait() }

// committed deletes, in the background, the early uploads the manifest
// does not list (files changed or removed after `saved`, or uploaded under
// another step's prefix and then again).
func (p *Pipeline) committed(m *checkpoint.Manifest) {
	keep := map[string]bool{}
	for _, f := range m.Files {
		keep[f.Key] = true
	}
	p.clean.Do(func() {
		p.bg.Add(1)
		go func() { defer p.bg.Done(); p.deleteUnused(keep) }()
	})
}

// deleteUnused removes the objects of piped files whose keys keep does not
// list; best effort (retention removes them later otherwise). It outlives
// the end of p's parent by up to 10 s (deleteGrace), counted from that
// end even when the deletion starts later: an agent that exits right
// after a failed save (a sidecar told to stop) still removes its early
// uploads, and its exit's bound (10 s after its loop) holds (a deletion
// begun at the exit could outlive it by up to 10 s).
func (p *Pipeline) deleteUnused(keep map[string]bool) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(p.parent), time.Minute)
	defer cancel()
	stop := context.AfterFunc(p.parent, func() {
		t := time.NewTimer(time.Until(p.parentEnd.endedAt().Add(deleteGrace)))
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
		case <-ctx.Done():
		}
	})
	defer stop()
	defer p.parentEnd.stop()
	for _, f := range p.files {
		if keep[f.key] || !f.started {
			continue
		}
		if err := p.c.Store.Delete(ctx, f.key); err != nil && !errors.Is(err, cloud.ErrNotExist) {
			p.log.Debug("could not delete an early upload", zap.String("key", f.key), zap.Error(err))
		}
	}
}

// deleteGrace is how long deleteUnused outlives p's parent.
const deleteGrace = 10 * time.Second

// endWatch records when a context ended.
type endWatch struct {
	at   atomic.Int64 // unix nanoseconds; 0: not seen to end
	stop func() bool  // stops watching
}

func watchEnd(ctx context.Context) *endWatch {
	w := &endWatch{}
	w.stop = context.AfterFunc(ctx, func() { w.at.Store(time.Now().UnixNano()) })
	return w
}

// endedAt is when the context ended, or now when it was not seen to end
// (yet: its AfterFunc may still be on its way).
func (w *endWatch) endedAt() time.Time {
	if at := w.at.Load(); at != 0 {
		return time.Unix(0, at)
	}
	return time.Now()
}

// take waits for every upload, then returns the entries that still stand
// for the files scan found now: same identity, and for a racily-clean
// file, the same content.
func (p *Pipeline) take(ctx context.Context, files []checkpoint.LocalFile) (map[string]checkpoint.File, time.Time, error) {
	p.mu.Lock()
	p.used = true
	refused := p.refused
	p.mu.Unlock()
	if refused != nil {
		return nil, time.Time{}, fmt.Errorf("a file reported saved: %w", refused)
	}
	waited := make(chan struct{})
	go func() { p.wg.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-ctx.Done():
		p.cancel()
		return nil, time.Time{}, fmt.Errorf("waiting for early uploads: %w", ctx.Err())
	}
	ok := map[string]checkpoint.File{}
	for _, lf := range files {
		f := p.files[lf.Rel]
		if f == nil || f.err != nil {
			continue
		}
		if why := p.stale(f, lf); why != "" {
			p.log.Warn("file changed after it was reported saved: uploading it again", zap.String("path", f.rel), zap.String("why", why))
			continue
		}
		ok[lf.Rel] = checkpoint.File{Path: f.rel, Key: f.key, Size: f.size, CRC32C: f.sum, BLAKE3: f.dig}
	}
	return ok, p.first, nil
}

// stale says why f no longer stands for the file lf, or "".
func (p *Pipeline) stale(f *pipedFile, lf checkpoint.LocalFile) string {
	info, err := p.root.Lstat(f.rel)
	switch {
	case err != nil:
		return err.Error()
	case !info.Mode().IsRegular() || lf.Size != f.size:
		return "size or type changed"
	case checkpoint.IdentOf(info) != f.ident:
		return "replaced or modified"
	case !f.racy:
		return ""
	}
	fh, err := checkpoint.OpenScanned(p.root, f.rel, f.size)
	if err != nil {
		return err.Error()
	}
	defer fh.Close()
	h := checkpoint.NewCRC32C()
	if _, err := io.Copy(h, fh); err != nil {
		return err.Error()
	}
	if hex.EncodeToString(h.Sum(nil)) != f.sum {
		return "content changed within the timestamp granularity"
	}
	return ""
}

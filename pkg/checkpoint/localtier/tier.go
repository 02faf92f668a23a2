// Package localtier keeps this machine's copy of the newest committed
// checkpoints, so that an agent restarting on the same machine restores
// from its own disk rather than from the store (docs/storage.md, "The
// local tier").
//
// A copy is kept only once its commit landed (the manifest and
// latest.json are written), from the very files the commit uploaded:
// hard links into the tier's directory where the file system allows,
// else a copy checked against the manifest. It is never trusted: restore
// chooses the checkpoint by the store's rules, then reads each file
// through the manifest's size and digest (BLAKE3, checkpoint.Tier), and
// fetches any file that fails from the next tier or the store; a copy of
// the same size and CRC32C but other bytes fails. A trainer that rewrites
// a file in place after its commit (the hard link shares it) costs that
// file's download, nothing more: that copy is dropped from the tier
// (Refuse), so that no peer is served it either.
package localtier

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"sync"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint"
)

// Options tunes a Tier.
type Options struct {
	// Keep is how many committed checkpoints are kept, highest step
	// first (restore's order); < 1 means 1.
	Keep int
	// MaxBytes > 0 bounds the bytes kept: older copies go first, and a
	// checkpoint larger than the bound is not kept at all.
	MaxBytes int64
	Log      *zap.Logger
}

// Tier is the local tier: checkpoint copies in one directory below a
// root that also holds the directories commits upload from.
type Tier struct {
	parent *os.Root // holds both the tier and the request directories
	rel    string   // the tier's directory below parent, "/"-separated
	opts   Options
	log    *zap.Logger
	mu     sync.Mutex // one Keep at a time, and AddPart's last step
}

var _ checkpoint.Tier = (*Tier)(nil)

// staging prefixes a copy being kept: never offered, removed by Open.
const staging = ".keeping-"

// Open opens the tier in the directory rel below parent, creating it
// (0700), and removes what an interrupted Keep left.
func Open(parent *os.Root, rel string, opts Options) (*Tier, error) {
	rel = path.Clean(rel)
	if err := checkpoint.SafeRel(rel); err != nil {
		return nil, err
	}
	if opts.Keep < 1 {
		opts.Keep = 1
	}
	t := &Tier{parent: parent, rel: rel, opts: opts, log: opts.Log}
	if t.log == nil {
		t.log = zap.NewNop()
	}
	if err := parent.MkdirAll(rel, 0o700); err != nil {
		return nil, fmt.Errorf("local tier: %w", err)
	}
	dir, err := t.dir()
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	for _, n := range names(dir) {
		if strings.HasPrefix(n, staging) {
			dir.RemoveAll(n)
		}
	}
	return t, nil
}

// Name is checkpoint.FromLocal.
func (t *Tier) Name() string { return checkpoint.FromLocal }

// dir opens the tier's directory, refusing a symlink anywhere on the way.
func (t *Tier) dir() (*os.Root, error) {
	d, err := checkpoint.OpenDir(t.parent, t.rel)
	if err != nil {
		return nil, fmt.Errorf("local tier: %w", err)
	}
	return d, nil
}

// dirName is the directory of checkpoint m's copy: its store folder's name.
func dirName(m *checkpoint.Manifest) string {
	return path.Base(strings.TrimSuffix(checkpoint.Prefix(m.Step, m.ID), "/"))
}

// partSep joins a checkpoint's directory name and another node's part
// in the name of the directory that part's copy is kept in (AddPart):
// <step:012d>-<id>+<node>. '+' is in no id, so no kept copy, nor any
// file of one, can have that name.
const partSep = "+"

// partDirName is the directory of the copy of another node's part of m.
func partDirName(m *checkpoint.Manifest, part string) string { return dirName(m) + partSep + part }

// Open returns the kept copy of file f of checkpoint m; an error wrapping
// fs.ErrNotExist when there is none. A file of another node's part is
// read from that part's own directory when the tier keeps one (AddPart):
// the manifest allows the same path in two parts. The caller verifies
// what it reads.
func (t *Tier) Open(ctx context.Context, m *checkpoint.Manifest, f checkpoint.File) (io.ReadCloser, error) {
	dir, err := t.dir()
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	if f.Part != "" && checkpoint.ValidID(f.Part) {
		rc, err := openSized(dir, partDirName(m, f.Part)+"/"+f.Path, f.Size)
		if err == nil || !errors.Is(err, fs.ErrNotExist) {
			return rc, err
		}
	}
	// An *os.File, unwrapped: the peer tier's server sends it by
	// sendfile(2).
	return openSized(dir, dirName(m)+"/"+f.Path, f.Size)
}

var _ checkpoint.CopyRefuser = (*Tier)(nil)

// RefuseCopy drops the kept copy of f of checkpoint m, which failed
// verification (a trainer rewrote it in place through the hard link, the
// disk, someone): no later restore and no peer is handed it. Each file is
// its own source: the tier's other copies are still asked.
func (t *Tier) RefuseCopy(m *checkpoint.Manifest, f checkpoint.File, err error) {
	dir, derr := t.dir()
	if derr != nil {
		return
	}
	defer dir.Close()
	rel := dirName(m) + "/" + f.Path
	if f.Part != "" && checkpoint.ValidID(f.Part) {
		if _, lerr := dir.Lstat(partDirName(m, f.Part) + "/" + f.Path); lerr == nil {
			rel = partDirName(m, f.Part) + "/" + f.Path // what Open served
		}
	}
	if derr = dir.Remove(rel); derr != nil && !errors.Is(derr, fs.ErrNotExist) {
		t.log.Warn("local tier: could not drop a copy that failed verification", zap.String("file", rel), zap.Error(derr))
		return
	}
	t.log.Warn("local tier: dropped a copy that failed verification", zap.String("file", rel), zap.Error(err))
}

// openSized is checkpoint.OpenRegular, whose error for a file of another
// size speaks of a scan: here it says the copy is not the manifest's size.
func openSized(dir *os.Root, rel string, size int64) (*os.File, error) {
	fh, err := checkpoint.OpenRegular(dir, rel, size)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		if fi, lerr := dir.Lstat(rel); lerr == nil && fi.Mode().IsRegular() && fi.Size() != size {
			return nil, fmt.Errorf("local tier: %s is %d bytes, the manifest says %d", rel, fi.Size(), size)
		}
	}
	return fh, err
}

// Keep makes the files of part of the committed checkpoint m ("": a
// single-node checkpoint's, all of them), found at their paths in the
// directory src below the tier's parent, the tier's copy of m, then drops
// the copies beyond the budget. Files are hard-linked; where a link is
// refused they are copied, unless copyOK is false (a checkpoint someone
// waits for: then nothing is kept). Call it only once m's commit landed
// and before src is deleted. Keep's error is for the log, never the
// commit's: a restore then reads the store.
func (t *Tier) Keep(ctx context.Context, src string, m *checkpoint.Manifest, part string, copyOK bool) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	files, bytes := partFiles(m, part)
	if t.opts.MaxBytes > 0 && bytes > t.opts.MaxBytes {
		t.log.Info("checkpoint larger than the local tier's budget: not kept", zap.Int64("bytes", bytes), zap.Int64("max_bytes", t.opts.MaxBytes))
		return nil
	}
	dir, err := t.dir()
	if err != nil {
		return err
	}
	defer dir.Close()
	tmp, err := checkpoint.MkdirTemp(dir, staging)
	if err != nil {
		return fmt.Errorf("local tier: %w", err)
	}
	defer dir.RemoveAll(tmp) // a no-op once renamed
	copied := 0
	for _, f := range files {
		if err := ctx.Err(); err != nil {
			return err
		}
		linked, err := t.keepFile(dir, src, tmp, f, copyOK)
		if err != nil {
			return fmt.Errorf("local tier: keep %s: %w", f.Path, err)
		}
		if !linked {
			copied++
		}
	}
	name := dirName(m)
	if err := dir.RemoveAll(name); err != nil { // a copy of the same checkpoint, kept before
		return fmt.Errorf("local tier: %w", err)
	}
	if err := dir.Rename(tmp, name); err != nil {
		return fmt.Errorf("local tier: %w", err)
	}
	t.log.Info("kept a local copy of the committed checkpoint", zap.String("id", m.ID), zap.Int64("step", m.Step),
		zap.Int("files", len(files)), zap.Int("copied", copied), zap.Int64("bytes", bytes))
	t.prune(dir)
	return nil
}

// partFiles are the files of m a node keeps, and their bytes.
func partFiles(m *checkpoint.Manifest, part string) ([]checkpoint.File, int64) {
	var out []checkpoint.File
	var n int64
	for _, f := range m.Files {
		if f.Part == part || len(m.Parts) == 0 {
			out = append(out, f)
			n += f.Size
		}
	}
	return out, n
}

// keepFile puts f (src/f.Path below the parent) at tmp/f.Path below dir: a
// hard link (true), or, if copyOK, a copy checked against f where the link
// fails (another file system, fs.protected_hardlinks).
func (t *Tier) keepFile(dir *os.Root, src, tmp string, f checkpoint.File, copyOK bool) (bool, error) {
	if d := path.Dir(f.Path); d != "." {
		if err := dir.MkdirAll(path.Join(tmp, d), 0o700); err != nil {
			return false, err
		}
	}
	from := path.Join(src, f.Path)
	// os.Root.Link links a symlink itself, never its target: such a
	// copy is refused when it is read back (OpenRegular).
	err := link(t.parent, from, path.Join(t.rel, tmp, f.Path))
	if err == nil {
		return true, nil
	}
	if !copyOK {
		return false, fmt.Errorf("hard link refused, and no time to copy: %w", err)
	}
	in, err := checkpoint.OpenRegular(t.parent, from, f.Size)
	if err != nil {
		return false, err
	}
	defer in.Close()
	out, err := dir.OpenFile(path.Join(tmp, f.Path), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return false, err
	}
	defer out.Close()
	if err := verifyCopy(out, in, f); err != nil {
		return false, err
	}
	return false, out.Close()
}

// link is os.Root.Link; tests make it fail.
var link = (*os.Root).Link

// verifyCopy copies r to w, checking it against f's size and digest.
func verifyCopy(w io.Writer, r io.Reader, f checkpoint.File) error {
	return checkpoint.CopyDigestVerified(w, r, f, nil)
}

// prune drops the copies beyond the budget: beyond Keep, highest step
// first, and beyond MaxBytes, oldest first. A copy's directories of other
// nodes' parts (AddPart) count with it and go with it; one whose copy is
// gone goes too.
func (t *Tier) prune(dir *os.Root) {
	var kept []string
	extra := map[string][]string{} // copy → its part directories
	for _, n := range names(dir) {
		if isCopy(n) {
			kept = append(kept, n)
		} else if ck, ok := isPartDir(n); ok {
			extra[ck] = append(extra[ck], n)
		}
	}
	// Names are <step:012d>-<id>: by name is by step.
	slices.Sort(kept)
	slices.Reverse(kept)
	var total int64
	for i, n := range kept {
		size := dirBytes(dir, n)
		for _, e := range extra[n] {
			size += dirBytes(dir, e)
		}
		total += size
		if i < t.opts.Keep && (t.opts.MaxBytes <= 0 || total <= t.opts.MaxBytes) {
			delete(extra, n)
			continue
		}
		if err := dir.RemoveAll(n); err != nil {
			t.log.Warn("local tier: could not drop an old copy", zap.String("dir", n), zap.Error(err))
			continue
		}
		t.log.Info("local tier: dropped an old copy", zap.String("dir", n), zap.Int64("bytes", size))
	}
	for _, es := range extra { // of copies dropped, or never kept
		for _, e := range es {
			if err := dir.RemoveAll(e); err != nil {
				t.log.Warn("local tier: could not drop an old copy", zap.String("dir", e), zap.Error(err))
			}
		}
	}
}

// isPartDir reports whether name is the directory of another node's part
// of a kept copy (partDirName), and that copy's name.
func isPartDir(name string) (string, bool) {
	ck, part, ok := strings.Cut(name, partSep)
	return ck, ok && isCopy(ck) && checkpoint.ValidID(part)
}

// copyBytes is the size of the kept copy name with its part directories.
func copyBytes(dir *os.Root, name string) int64 {
	n := dirBytes(dir, name)
	for _, e := range names(dir) {
		if ck, ok := isPartDir(e); ok && ck == name {
			n += dirBytes(dir, e)
		}
	}
	return n
}

// dirBytes is the size of the regular files below name.
func dirBytes(dir *os.Root, name string) int64 {
	var n int64
	fs.WalkDir(dir.FS(), name, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// isCopy reports whether name is a kept copy's: <step:012d>-<id>.
func isCopy(name string) bool {
	step, id, ok := strings.Cut(name, "-")
	if !ok || len(step) != 12 || !checkpoint.ValidID(id) {
		return false
	}
	return strings.Trim(step, "0123456789") == ""
}

// names lists dir's entries; what cannot be read is left out.
func names(dir *os.Root) []string {
	f, err := dir.Open(".")
	if err != nil {
		return nil
	}
	defer f.Close()
	n, _ := f.Readdirnames(-1)
	return n
}

// Held lists the checkpoints the tier holds a copy of, by their store
// folder's name (<step:012d>-<id>), highest step first: what a node tells
// its peers it can serve (pkg/checkpoint/peertier).
func (t *Tier) Held() []string {
	dir, err := t.dir()
	if err != nil {
		return nil
	}
	defer dir.Close()
	var out []string
	for _, n := range names(dir) {
		if isCopy(n) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	slices.Reverse(out)
	return out
}

// AddPart adds the files of another node's part of the committed job
// checkpoint m to the tier's copy of m (made if there is none), each read
// from open and checked against the manifest: a replica a peer asks for
// when that node is gone (pkg/checkpoint/peertier, --replicas). Nothing is
// added beyond the budget (MaxBytes), or when a file fails. The files are
// read outside the lock that Keep holds: a Keep of this node's newest
// checkpoint (an interruption's) never waits for a peer's transfer.
func (t *Tier) AddPart(ctx context.Context, m *checkpoint.Manifest, part string, open func(context.Context, checkpoint.File) (io.ReadCloser, error)) error {
	if len(m.Parts) == 0 {
		return fmt.Errorf("local tier: not a job checkpoint")
	}
	if !checkpoint.ValidID(part) {
		return fmt.Errorf("local tier: bad part %q", part)
	}
	files, bytes := partFiles(m, part)
	if len(files) == 0 {
		return fmt.Errorf("local tier: checkpoint %s has no files of part %s", m.ID, part)
	}
	dir, err := t.dir()
	if err != nil {
		return err
	}
	defer dir.Close()
	name, pname := dirName(m), partDirName(m, part)
	if !t.partFits(dir, name, pname, part, bytes) {
		return nil
	}
	tmp, err := checkpoint.MkdirTemp(dir, staging)
	if err != nil {
		return fmt.Errorf("local tier: %w", err)
	}
	defer dir.RemoveAll(tmp) // a no-op once renamed
	for _, f := range files {
		if err := addFile(ctx, dir, path.Join(tmp, f.Path), f, open); err != nil {
			return fmt.Errorf("local tier: %s of %s: %w", f.Path, part, err)
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.partFitsLocked(dir, name, pname, part, bytes) { // a Keep since then may have filled it
		return nil
	}
	// The part has a directory of its own, beside this node's copy (made
	// empty if there is none, so that the checkpoint is listed as held):
	// a file of the same path in both parts overwrites neither.
	if err := dir.MkdirAll(name, 0o700); err != nil {
		return fmt.Errorf("local tier: %w", err)
	}
	if err := dir.RemoveAll(pname); err != nil { // a copy of the same part, kept before
		return fmt.Errorf("local tier: %w", err)
	}
	if err := dir.Rename(tmp, pname); err != nil {
		return fmt.Errorf("local tier: %w", err)
	}
	t.log.Info("kept a copy of another node's part of the committed checkpoint", zap.String("id", m.ID), zap.Int64("step", m.Step),
		zap.String("part", part), zap.Int("files", len(files)), zap.Int64("bytes", bytes))
	t.prune(dir)
	return nil
}

// partFits: another node's part of bytes fits the budget beside copy
// name (its directory pname replaced); logged when not.
func (t *Tier) partFits(dir *os.Root, name, pname, part string, bytes int64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.partFitsLocked(dir, name, pname, part, bytes)
}

func (t *Tier) partFitsLocked(dir *os.Root, name, pname, part string, bytes int64) bool {
	if t.opts.MaxBytes > 0 && copyBytes(dir, name)-dirBytes(dir, pname)+bytes > t.opts.MaxBytes {
		t.log.Info("another node's part does not fit the local tier's budget: not kept", zap.String("part", part), zap.Int64("bytes", bytes), zap.Int64("max_bytes", t.opts.MaxBytes))
		return false
	}
	return true
}

// addTries bounds the copies of one file AddPart reads: a copy that fails
// verification is refused (checkpoint.Refusable: its source is not asked
// again) and the file read from the next source open finds.
const addTries = 4

// addFile writes f, read from open, at rel below dir, checked against f's
// size and digest. A file without a digest is never copied from a peer.
func addFile(ctx context.Context, dir *os.Root, rel string, f checkpoint.File, open func(context.Context, checkpoint.File) (io.ReadCloser, error)) error {
	if !f.HasDigest() {
		return fmt.Errorf("%s: %w", f.Path, checkpoint.ErrNoDigest)
	}
	if d := path.Dir(rel); d != "." {
		if err := dir.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	out, err := dir.OpenFile(rel, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	for try := 1; ; try++ {
		err = copyFrom(ctx, out, f, open)
		if err == nil || try == addTries || !errors.Is(err, errRefused) {
			break
		}
		if err := out.Truncate(0); err != nil {
			return err
		}
		if _, err := out.Seek(0, io.SeekStart); err != nil {
			return err
		}
	}
	if err != nil {
		return err
	}
	return out.Close()
}

// errRefused marks a copy that failed verification and whose source was
// told so: another may be asked.
var errRefused = errors.New("copy refused")

// copyFrom copies f from open into out, verified; a copy that fails and
// can be refused is, and the error wraps errRefused.
func copyFrom(ctx context.Context, out io.Writer, f checkpoint.File, open func(context.Context, checkpoint.File) (io.ReadCloser, error)) error {
	in, err := open(ctx, f)
	if err != nil {
		return err
	}
	defer in.Close()
	err = verifyCopy(out, in, f)
	if r, ok := in.(checkpoint.Refusable); ok && errors.Is(err, checkpoint.ErrCorrupt) {
		r.Refuse(err)
		return fmt.Errorf("%w: %w", errRefused, err)
	}
	return err
}

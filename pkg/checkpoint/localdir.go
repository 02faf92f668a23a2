package checkpoint

// The local side: a checkpoint directory opened and scanned without
// following what a trainer could swap in (os.Root, regular files only, the
// owner checked), files written and directories removed through the root,
// and the progress of a transfer (bytes done, reported while it runs).

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"
)

// Local directories a trainer can write to are handled through os.Root
// handles, never by path: a trainer that swaps a directory for a symlink
// between two calls cannot make the agent read, write or delete outside.
// os.Root alone keeps every operation below its directory but follows
// symlinks that stay inside it; OpenDir and OpenScanned also refuse those,
// by comparing what they opened with what the name is (Lstat).

// OpenDir opens the directory rel below parent ("/"- or
// filepath-separated, relative). No element of rel may be a symlink,
// wherever it points: each one is opened and checked to be the very
// directory its name holds, so a swap between the check and the open is
// caught too. The caller closes the returned Root.
func OpenDir(parent *os.Root, rel string) (*os.Root, error) {
	rel = filepath.ToSlash(filepath.Clean(rel))
	if rel == "." {
		return parent.OpenRoot(".")
	}
	if err := SafeRel(rel); err != nil {
		return nil, err
	}
	cur, err := parent.OpenRoot(".")
	if err != nil {
		return nil, err
	}
	for _, e := range strings.Split(rel, "/") {
		next, err := openChildDir(cur, e)
		cur.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", rel, err)
		}
		cur = next
	}
	return cur, nil
}

// openChildDir opens the directory name directly below r, refusing a
// symlink or anything else that is not a directory.
func openChildDir(r *os.Root, name string) (*os.Root, error) {
	fi, err := r.Lstat(name)
	if err != nil {
		return nil, err
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		return nil, fmt.Errorf("%s is a symlink: %w", name, ErrRefused)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%s is not a directory (%s): %w", name, fi.Mode().Type(), ErrRefused)
	}
	sub, err := r.OpenRoot(name)
	if err != nil {
		return nil, err
	}
	got, err := sub.Stat(".")
	if err == nil && !os.SameFile(fi, got) {
		err = fmt.Errorf("%s changed while it was opened: %w", name, ErrRefused)
	}
	if err != nil {
		sub.Close()
		return nil, err
	}
	return sub, nil
}

// OpenScanned opens the regular file rel below root for reading without
// ever blocking in open(2) (a FIFO planted there would) and refuses
// anything else: a FIFO, a device, a socket, a symlink, or a file whose
// size is not want (the size the scan saw). owners, when given, are the
// uids of the trainer that wrote the file, another user than the agent's:
// the file must be one of theirs with a single link (CheckOwnedBy).
func OpenScanned(root *os.Root, rel string, want int64, owners ...int) (*os.File, error) {
	fh, err := root.OpenFile(rel, os.O_RDONLY|ONonblock, 0)
	if err != nil {
		return nil, err
	}
	err = CheckRegular(root, rel, fh, want, owners...)
	if err != nil {
		fh.Close()
		return nil, err
	}
	return fh, nil
}

// CheckRegular checks fh, opened as rel below root, as OpenScanned does:
// a regular file, one of owners' (when given), of size want, and still
// the file at rel.
func CheckRegular(root *os.Root, rel string, fh *os.File, want int64, owners ...int) error {
	info, err := fh.Stat()
	if err != nil {
		return err
	}
	if !info.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file (%s): %w", rel, info.Mode().Type(), ErrRefused)
	}
	if len(owners) > 0 {
		if err := CheckOwnedBy(rel, info, owners); err != nil {
			return err
		}
	}
	if info.Size() != want {
		return fmt.Errorf("%s changed after the scan: %d bytes, scanned %d", rel, info.Size(), want)
	}
	// root.OpenFile follows a symlink that stays inside root: the name
	// must still be the file opened, not a link to another one.
	if li, err := root.Lstat(rel); err != nil || !os.SameFile(li, info) {
		return fmt.Errorf("%s was replaced while it was opened: %w", rel, ErrRefused)
	}
	return nil
}

// ErrNotOwned reports a file a trainer of another user than the agent put
// in its checkpoint that is not its own (CheckOwnedBy's rule): never
// uploaded.
var ErrNotOwned = fmt.Errorf("not the trainer's own file: %w", ErrRefused)

// CheckOwnedBy checks that the file rel (info: its fstat) is owned by one of
// uids and has a single link: the rule for a checkpoint directory written
// by a trainer of another user than the agent's (node and sidecar modes,
// an agent running as root; commit.Request.Owners). Otherwise a trainer
// could hard-link a file only the agent may read (fs.protected_hardlinks=0)
// into its checkpoint and read it back from the store.
func CheckOwnedBy(rel string, info fs.FileInfo, uids []int) error {
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	if !slices.Contains(uids, int(st.Uid)) {
		return fmt.Errorf("%s is owned by uid %d, not by the trainer (uid %v): %w", rel, st.Uid, uids, ErrNotOwned)
	}
	if st.Nlink > 1 {
		return fmt.Errorf("%s has %d hard links (a trainer of another user must not hard-link files into its checkpoint): %w", rel, st.Nlink, ErrNotOwned)
	}
	return nil
}

// RemoveDir deletes the directory rel below parent. held, when not nil, is
// the directory as it was opened earlier (for the commit): its contents
// are deleted through it, and the name only if it still is that directory.
// A symlink at rel is removed itself; what it points at is never touched.
func RemoveDir(parent *os.Root, rel string, held *os.Root) error {
	if c := filepath.Clean(rel); c == "." || c == "" {
		// Emptying parent itself is never what a caller means.
		return fmt.Errorf("remove %q: not a directory below the root: %w", rel, ErrRefused)
	}
	if held == nil {
		h, err := OpenDir(parent, rel)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			if fi, lerr := parent.Lstat(rel); lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
				return parent.Remove(rel)
			}
			return err
		}
		defer h.Close()
		held = h
	}
	d, err := held.Open(".")
	if err != nil {
		return err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := held.RemoveAll(n); err != nil {
			return err
		}
	}
	fi, err := parent.Lstat(rel)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if got, err := held.Stat("."); err != nil || !os.SameFile(fi, got) {
		return nil // not the directory any more: leave whatever is there now
	}
	return parent.Remove(rel)
}

// WriteFile writes data to name below root, replacing what was there:
// through a temp file created with O_EXCL (so a planted symlink is never
// followed) and renamed over name (a symlink at name is replaced, not
// followed).
func WriteFile(root *os.Root, name string, data []byte, perm os.FileMode) error {
	var b [6]byte
	rand.Read(b[:])
	dir, base := filepath.Split(name)
	tmp := filepath.Join(dir, "."+base+".tmp-"+hex.EncodeToString(b[:]))
	fh, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|ONoFollow, perm)
	if err != nil {
		return err
	}
	_, err = fh.Write(data)
	if cerr := fh.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = root.Rename(tmp, name)
	}
	if err != nil {
		root.Remove(tmp)
	}
	return err
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

// ErrRefused reports a checkpoint directory that holds something the agent
// will not upload: a symlink, a device, a socket, or a path outside it.
var ErrRefused = errors.New("refused")

// LocalFile is one regular file found in a checkpoint directory.
type LocalFile struct {
	Rel  string // "/"-separated, relative to the directory
	Size int64
}

// Scan lists the regular files under root. Anything that is not a regular
// file or a directory (symlinks included, wherever they point) refuses the
// whole checkpoint: committing part of what the trainer meant to save would
// be worse than committing nothing. So does a name that is not UTF-8: the
// manifest is JSON, which would turn it into another name that no object
// has. Directories are opened with O_NONBLOCK|O_DIRECTORY, so a FIFO
// swapped in for one fails at once instead of blocking.
func Scan(root *os.Root) ([]LocalFile, error) {
	var files []LocalFile
	if err := scanDir(root, ".", &files); err != nil {
		return nil, fmt.Errorf("scan %s: %w", root.Name(), err)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("scan %s: no files", root.Name())
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Rel < files[j].Rel })
	return files, nil
}

func scanDir(root *os.Root, dir string, files *[]LocalFile) error {
	d, err := root.OpenFile(dir, os.O_RDONLY|ONonblock|oDirectory, 0)
	if err != nil {
		return err
	}
	ents, err := d.ReadDir(-1)
	d.Close()
	if err != nil {
		return err
	}
	for _, e := range ents {
		rel := path.Join(dir, e.Name())
		if !utf8.ValidString(e.Name()) {
			return fmt.Errorf("%q: file name is not valid UTF-8: %w", rel, ErrRefused)
		}
		if err := SafeRel(rel); err != nil {
			return fmt.Errorf("%q: %w", rel, ErrRefused)
		}
		switch t := e.Type(); {
		case t.IsDir():
			if err := scanDir(root, rel, files); err != nil {
				return err
			}
			continue
		case t.IsRegular():
		default:
			return fmt.Errorf("%s: %s is not a regular file: %w", rel, t, ErrRefused)
		}
		info, err := root.Lstat(rel) // not e.Info(): that goes by path
		if err != nil {
			return err
		}
		if !info.Mode().IsRegular() { // replaced since the listing
			return fmt.Errorf("%s: %s is not a regular file: %w", rel, info.Mode().Type(), ErrRefused)
		}
		*files = append(*files, LocalFile{Rel: rel, Size: info.Size()})
	}
	return nil
}

// OpenLocalDir opens dir, which must be a directory and not a symlink, and
// makes sure what it opened is what it checked: for a commit, a check of a
// local copy, or watch mode's handle on DIR.
func OpenLocalDir(dir string) (*os.Root, error) {
	fi, err := os.Lstat(dir)
	if err != nil {
		return nil, fmt.Errorf("checkpoint directory: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("checkpoint directory %s: not a directory (%s): %w", dir, fi.Mode().Type(), ErrRefused)
	}
	r, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("checkpoint directory: %w", err)
	}
	if got, err := r.Stat("."); err != nil || !os.SameFile(fi, got) {
		r.Close()
		return nil, fmt.Errorf("checkpoint directory %s changed while it was opened: %w", dir, ErrRefused)
	}
	return r, nil
}

// progressEvery is how often long transfers log their progress.
const progressEvery = 5 * time.Second

// Progress counts bytes moved by several concurrent transfers and logs the
// total every few seconds while it runs.
type Progress struct {
	done  atomic.Int64
	Total int64
	Start time.Time
}

// Add counts n more bytes moved.
func (p *Progress) Add(n int) { p.done.Add(int64(n)) }

// Done is the bytes counted so far.
func (p *Progress) Done() int64 { return p.done.Load() }

// Report logs until ctx ends; call it in its own goroutine.
func (p *Progress) Report(ctx context.Context, log *zap.Logger, what string) {
	t := time.NewTicker(progressEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			done := p.done.Load()
			elapsed := time.Since(p.Start).Seconds()
			rate := float64(done) / elapsed
			fields := []zap.Field{
				zap.Int64("bytes", done), zap.Int64("total", p.Total),
				zap.Float64("mb_per_s", rate/1e6),
			}
			if rate > 0 && p.Total > done {
				fields = append(fields, zap.Duration("eta", time.Duration(float64(p.Total-done)/rate*float64(time.Second)).Round(time.Second)))
			}
			log.Info(what+" progress", fields...)
		}
	}
}

// hashChunk caps each read of a CountingReader. A store fills 16 MiB part
// buffers with one io.ReadFull; read whole, the bytes have left the CPU
// cache before sha256 (and the S3 store's CRC32C) get to them. In 256 KiB
// steps they are hashed while still in L2. A 1 GiB commit to MinIO took
// 1.85 core-seconds before, 1.61 with this alone and 1.45 with the S3
// store's CRC32C in the same pass (64 KiB steps: the same; 1 MiB: 1.6).
const hashChunk = 256 << 10

// CountingReader counts and hashes what passes through it (H: a hash, or
// Sums).
type CountingReader struct {
	R io.Reader
	H io.Writer
	N int64
	P *Progress
}

func (c *CountingReader) Read(b []byte) (int, error) {
	if len(b) > hashChunk {
		b = b[:hashChunk]
	}
	n, err := c.R.Read(b)
	if n > 0 {
		c.H.Write(b[:n])
		c.N += int64(n)
		c.P.Add(n)
	}
	return n, err
}

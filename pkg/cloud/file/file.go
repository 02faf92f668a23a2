// Package file implements cloud.Store on a local (or network) directory.
//
// Put writes a temp file next to the target, fsyncs it, and renames it into
// place (then fsyncs the directory), so readers see the old or the complete
// new object. Temp files are named ".spotagent-tmp-*" and never listed;
// Cleanup removes the ones a crashed writer left.
package file

// The file:// backend: objects as files under a root directory, written to
// a temp file, fsynced, then linked or renamed into place (under a lock
// when conditional), listed by walking the tree, a crashed writer's temp
// files cleaned up.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spotagent/spotagent/internal/pathtrust"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// tmpPrefix names temp files so Cleanup can find them; names with
// reservedPrefix are never objects.
const (
	reservedPrefix = ".spotagent-"
	tmpPrefix      = reservedPrefix + "tmp-"
	lockName       = reservedPrefix + "lock"
)

// Modes of what the store creates: its objects hold checkpoints, and its
// lock file must not be held by another user (which would hang every
// compare-and-swap): the owner's only. Directories that exist already
// keep theirs.
const (
	dirMode  = 0o700
	fileMode = 0o600
)

// Store keeps objects as files under root.
type Store struct {
	root string

	mu     sync.Mutex          // guards active
	active map[string]struct{} // temp files of Puts in flight, kept by Cleanup
	cas    chan struct{}       // serialises IfVersion puts inside this process (a ctx-aware mutex)
}

var (
	_ cloud.Store   = (*Store)(nil)
	_ cloud.Cleaner = (*Store)(nil)
)

// New returns a store rooted at root, creating the directory if needed.
func New(root string) (*Store, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("file store: %w", err)
	}
	if err := os.MkdirAll(abs, dirMode); err != nil {
		return nil, fmt.Errorf("file store: %w", err)
	}
	if abs, err = trustedRoot(abs, false); err != nil {
		return nil, fmt.Errorf("file store: %w", err)
	}
	return &Store{root: abs, active: map[string]struct{}{}, cas: make(chan struct{}, 1)}, nil
}

// trustedRoot resolves root's symlinks and checks that no user the agent
// does not trust can change what the store holds: a checkpoint planted
// there is restored, and loading it runs the planter's code. The store's
// directory must be its owner's alone (not writable by group or others),
// and each directory above it owned by a trusted user and not writable by
// group or others unless sticky (like /tmp, where nobody else can rename
// the store away). Trusted: root and the agent's euid; for a read-only
// open, also the store's owner (a colleague's store one reads is as
// trustworthy as the colleague). A store owned by another user is refused
// for writing. The store keeps the resolved path: a symlink that another
// user can re-point is not followed again.
func trustedRoot(abs string, readOnly bool) (string, error) {
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return "", err
	}
	fi, err := os.Stat(real)
	if err != nil {
		return "", err
	}
	euid := os.Geteuid()
	owner := pathtrust.Owner(fi)
	trusted := func(uid int) bool {
		return uid == 0 || uid == euid || pathtrust.Outside(uid) || (readOnly && uid == owner)
	}
	where := real
	if real != abs {
		where = abs + " (-> " + real + ")"
	}
	if !trusted(owner) {
		return "", fmt.Errorf("%w: %s (mode %s) is owned by %s, not by %s that runs spotagent: that user can plant a checkpoint there; chown it, or pick a directory of your own",
			ErrUntrusted, where, fi.Mode(), pathtrust.UIDName(owner), pathtrust.UIDName(euid))
	}
	if m := fi.Mode(); m.Perm()&0o022 != 0 {
		return "", fmt.Errorf("%w: %s (owner %s, mode %s) is writable by group or others: they can plant a checkpoint there; chmod go-w it (chmod 700), or pick a directory of your own",
			ErrUntrusted, where, pathtrust.UIDName(owner), m)
	}
	_, bad, err := pathtrust.Walk(real, trusted) // real holds no symlink: the directories above it
	if err != nil {
		return "", err
	}
	if len(bad) == 0 {
		return real, nil
	}
	if u := bad[0]; u.Writable {
		return "", fmt.Errorf("%w: %s, above the store %s, is writable by group or others and not sticky (owner %s, mode %s): they can replace the store; chmod go-w or +t it, or pick a directory elsewhere",
			ErrUntrusted, u.Path, where, pathtrust.UIDName(u.Owner), u.Mode)
	}
	return "", fmt.Errorf("%w: %s, above the store %s, is owned by %s (mode %s): that user can replace the store; pick a directory elsewhere",
		ErrUntrusted, bad[0].Path, where, pathtrust.UIDName(bad[0].Owner), bad[0].Mode)
}

// ErrUntrusted is a store directory that a user other than the agent's
// (or root) can change.
var ErrUntrusted = errors.New("untrusted store directory")

// Open returns a store rooted at root for reading: it creates nothing, and
// a root that does not exist (or is not a directory) is an error wrapping
// cloud.ErrBucketNotFound, the file store's missing bucket. Read-only
// commands use it so that a mistyped path fails instead of reading as an
// empty store.
func Open(root string) (*Store, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("file store: %w", err)
	}
	fi, err := os.Stat(abs)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, noDirError{abs, "does not exist"}
		}
		return nil, fmt.Errorf("file store: %w", err)
	}
	if !fi.IsDir() {
		return nil, noDirError{abs, "is not a directory"}
	}
	if abs, err = trustedRoot(abs, true); err != nil {
		return nil, fmt.Errorf("file store: %w", err)
	}
	return &Store{root: abs, active: map[string]struct{}{}, cas: make(chan struct{}, 1)}, nil
}

// noDirError is a missing root: it reads as the directory and why, and
// compares as cloud.ErrBucketNotFound.
type noDirError struct{ dir, why string }

func (e noDirError) Error() string        { return "directory " + e.dir + " " + e.why }
func (e noDirError) Is(target error) bool { return target == cloud.ErrBucketNotFound }

// Root is the absolute directory the store writes under.
func (s *Store) Root() string { return s.root }

// URI returns file:///abs/root/key.
func (s *Store) URI(key string) string {
	u := "file://" + filepath.ToSlash(s.root)
	if key != "" {
		u += "/" + key
	}
	return u
}

// Close is a no-op: the store holds no open files between calls.
func (s *Store) Close() error { return nil }

func (s *Store) path(key string) (string, error) {
	if err := cloud.ValidKey(key); err != nil {
		return "", err
	}
	for _, el := range strings.Split(key, "/") {
		if strings.HasPrefix(el, reservedPrefix) {
			return "", fmt.Errorf("%w: %q is reserved", cloud.ErrInvalidKey, key)
		}
	}
	return filepath.Join(s.root, filepath.FromSlash(key)), nil
}

// Get opens the object and returns a reader of length bytes from offset.
func (s *Store) Get(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p, err := s.path(key)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, notExist(err)
	}
	if fi, err := f.Stat(); err != nil || fi.IsDir() {
		f.Close()
		return nil, fmt.Errorf("get %s: %w", key, cloud.ErrNotExist)
	}
	if offset > 0 {
		if _, err := f.Seek(offset, io.SeekStart); err != nil {
			f.Close()
			return nil, fmt.Errorf("get %s: %w", key, err)
		}
	}
	if length < 0 {
		return f, nil
	}
	return struct {
		io.Reader
		io.Closer
	}{io.LimitReader(f, length), f}, nil
}

// Stat returns the object's size, mtime and version token.
func (s *Store) Stat(ctx context.Context, key string) (cloud.ObjectInfo, error) {
	if err := ctx.Err(); err != nil {
		return cloud.ObjectInfo{}, err
	}
	p, err := s.path(key)
	if err != nil {
		return cloud.ObjectInfo{}, err
	}
	fi, err := os.Stat(p)
	if err != nil {
		return cloud.ObjectInfo{}, notExist(err)
	}
	if fi.IsDir() {
		return cloud.ObjectInfo{}, fmt.Errorf("stat %s: %w", key, cloud.ErrNotExist)
	}
	return info(key, fi), nil
}

// Delete removes the object and then any directories it leaves empty.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p, err := s.path(key)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	// Best effort: stops at the first directory that is not empty. A Put
	// racing into a removed directory recreates it (see createTemp).
	for d := filepath.Dir(p); d != s.root && strings.HasPrefix(d, s.root); d = filepath.Dir(d) {
		if os.Remove(d) != nil {
			break
		}
	}
	return nil
}

func notExist(err error) error {
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, errNotDir) {
		return fmt.Errorf("%w: %w", cloud.ErrNotExist, err)
	}
	return err
}

// CheckRead verifies that the directory can be listed, writing nothing.
func (s *Store) CheckRead(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	f, err := os.Open(s.root)
	if err != nil {
		return fmt.Errorf("%s: %w", s.URI(""), err)
	}
	defer f.Close()
	if _, err := f.Readdirnames(1); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("%s: %w", s.URI(""), err)
	}
	return nil
}

// Check verifies that the directory is writable by creating and removing
// a temp file in it.
func (s *Store) Check(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	f, err := os.CreateTemp(s.root, tmpPrefix+"check-*")
	if err != nil {
		return fmt.Errorf("%s: %w", s.URI(""), err)
	}
	f.Close()
	return os.Remove(f.Name())
}

var errNotDir = syscall.ENOTDIR

// Put writes r to key atomically: temp file, fsync, then link (IfAbsent)
// or rename into place, then fsync the directory.
func (s *Store) Put(ctx context.Context, key string, r io.Reader, size int64, opts cloud.PutOptions) error {
	p, err := s.path(key)
	if err != nil {
		return err
	}
	tmp, err := s.createTemp(filepath.Dir(p))
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	defer s.forget(tmp.Name())
	defer os.Remove(tmp.Name()) // no-op after a rename; drops the temp otherwise
	if err := s.fill(ctx, tmp, r, size); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	if err := s.commit(ctx, tmp.Name(), p, opts); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	return syncDir(filepath.Dir(p))
}

// createTemp makes the directory and a temp file in it. It retries when a
// concurrent Delete removed the freshly made (still empty) directory.
func (s *Store) createTemp(dir string) (*os.File, error) {
	var err error
	for range 5 {
		if err = os.MkdirAll(dir, dirMode); err != nil {
			return nil, err
		}
		var f *os.File
		if f, err = os.CreateTemp(dir, tmpPrefix+"*"); err == nil {
			s.mu.Lock()
			s.active[f.Name()] = struct{}{}
			s.mu.Unlock()
			return f, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
	}
	return nil, err
}

func (s *Store) forget(name string) {
	s.mu.Lock()
	delete(s.active, name)
	s.mu.Unlock()
}

// fill copies r into f, checking ctx between chunks, and fsyncs f.
func (s *Store) fill(ctx context.Context, f *os.File, r io.Reader, size int64) error {
	defer f.Close()
	n, err := io.CopyBuffer(f, cloud.ContextReader(ctx, r), make([]byte, 1<<20))
	if err != nil {
		return err
	}
	if size >= 0 && n != size {
		return fmt.Errorf("read %d bytes, want %d", n, size)
	}
	if err := f.Sync(); err != nil {
		return err
	}
	return f.Close()
}

func (s *Store) commit(ctx context.Context, tmp, p string, opts cloud.PutOptions) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	switch {
	case opts.IfAbsent:
		// link(2) fails with EEXIST when p exists: atomic create-if-absent,
		// also across processes on local filesystems.
		if err := os.Link(tmp, p); err != nil {
			if errors.Is(err, os.ErrExist) {
				return cloud.ErrPrecondition
			}
			return err
		}
		return nil
	case opts.IfVersion != "":
		unlock, err := s.lock(ctx)
		if err != nil {
			return err
		}
		defer unlock()
		fi, err := os.Stat(p)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return cloud.ErrPrecondition
			}
			return err
		}
		if version(fi) != opts.IfVersion {
			return cloud.ErrPrecondition
		}
	}
	return os.Rename(tmp, p)
}

// lock serialises IfVersion compare-and-rename within this process and,
// through flock(2) on a lock file in root, with other processes. Both
// waits end with ctx: a process that holds the lock forever (another
// user's cannot: the file is 0600, and a symlink in its place is refused)
// fails this Put, it never hangs the agent's commits or its exit.
func (s *Store) lock(ctx context.Context) (func(), error) {
	select {
	case s.cas <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("store lock: waiting for another write of this process: %w", ctx.Err())
	}
	release := func() { <-s.cas }
	f, err := os.OpenFile(filepath.Join(s.root, lockName), os.O_CREATE|os.O_RDWR|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, fileMode)
	if err != nil {
		release()
		return nil, fmt.Errorf("lock: %w", err)
	}
	if err := flockCtx(ctx, f); err != nil {
		f.Close()
		release()
		return nil, fmt.Errorf("store lock %s: %w", f.Name(), err)
	}
	return func() {
		f.Close() // releases the flock
		release()
	}, nil
}

// flockCtx takes an exclusive flock on f, polling (LOCK_NB) with a
// backoff of 1 ms doubling to 50 ms until it has it or ctx ends: a blocking
// flock cannot be cancelled.
func flockCtx(ctx context.Context, f *os.File) error {
	wait := time.Millisecond
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("held by another process (a second agent, or flock(1)): gave up: %w", ctx.Err())
		case <-t.C:
		}
		wait = min(2*wait, 50*time.Millisecond)
	}
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync dir: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync dir: %w", err)
	}
	return nil
}

// List walks the directories under prefix in lexical key order without
// collecting every key first: a directory "a" sorts as "a/", so all keys
// under it fall between "a" and its siblings exactly as their full keys do.
func (s *Store) List(ctx context.Context, prefix string, fn func(cloud.ObjectInfo) error) error {
	dir := ""
	if i := strings.LastIndex(prefix, "/"); i >= 0 {
		dir = prefix[:i]
	}
	err := s.walk(ctx, dir, prefix, fn)
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, errNotDir) {
		return nil
	}
	return err
}

func (s *Store) walk(ctx context.Context, dir, prefix string, fn func(cloud.ObjectInfo) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	entries, err := os.ReadDir(filepath.Join(s.root, filepath.FromSlash(dir)))
	if err != nil {
		return err
	}
	sortKey := func(e os.DirEntry) string {
		if e.IsDir() {
			return e.Name() + "/"
		}
		return e.Name()
	}
	slices.SortFunc(entries, func(a, b os.DirEntry) int { return strings.Compare(sortKey(a), sortKey(b)) })
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), reservedPrefix) {
			continue
		}
		key := path.Join(dir, e.Name())
		if e.IsDir() {
			if strings.HasPrefix(key+"/", prefix) || strings.HasPrefix(prefix, key+"/") {
				if err := s.walk(ctx, key, prefix, fn); err != nil && !errors.Is(err, os.ErrNotExist) {
					return err
				}
			}
			continue
		}
		if !strings.HasPrefix(key, prefix) || !e.Type().IsRegular() {
			continue
		}
		fi, err := e.Info()
		if errors.Is(err, os.ErrNotExist) {
			continue // deleted while listing
		}
		if err != nil {
			return fmt.Errorf("list: %w", err)
		}
		if err := fn(info(key, fi)); err != nil {
			return err
		}
	}
	return nil
}

func info(key string, fi os.FileInfo) cloud.ObjectInfo {
	return cloud.ObjectInfo{Key: key, Size: fi.Size(), Modified: fi.ModTime(), Version: version(fi)}
}

// version is inode-size-mtime. Every Put makes a new inode and rename keeps
// it, so a rewrite changes the token even with identical content. Limit: an
// inode number freed by one rewrite can be reused by a later one; if that
// file also has the same size and an mtime in the same clock tick, a stale
// token would match. Filesystems without stable inodes (some FUSE/NFS
// setups) weaken it further.
func version(fi os.FileInfo) string {
	var ino uint64
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		ino = st.Ino
	}
	return fmt.Sprintf("%x-%x-%x", ino, fi.Size(), fi.ModTime().UnixNano())
}

// Cleanup removes temp files left by crashed writers anywhere under root.
// Temp files of this store's own Puts in flight are kept. Run it at start,
// before other writers share the directory: a temp file of another live
// process would be removed and that Put would fail (not corrupt anything).
// With opts, a temp file counts as a write of the key its name has in
// place of the final element, and is removed only when opts says so (its
// mtime as the time the write started).
func (s *Store) Cleanup(ctx context.Context, opts ...cloud.CleanupOptions) (int, error) {
	o := cloud.CleanupOpts(opts)
	now := time.Now()
	n := 0
	err := filepath.WalkDir(s.root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if d.IsDir() || !strings.HasPrefix(d.Name(), tmpPrefix) {
			return nil
		}
		if o.Owned != nil {
			info, err := d.Info()
			if err != nil {
				return nil // gone meanwhile
			}
			rel, err := filepath.Rel(s.root, p)
			if err != nil || !o.Removes(filepath.ToSlash(rel), info.ModTime(), now) {
				return nil
			}
		}
		s.mu.Lock()
		_, busy := s.active[p]
		s.mu.Unlock()
		if busy {
			return nil
		}
		if err := os.Remove(p); err == nil {
			n++
		}
		return nil
	})
	if err != nil {
		return n, fmt.Errorf("cleanup: %w", err)
	}
	return n, nil
}

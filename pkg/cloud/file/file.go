// Package file implements cloud.Store on a local (or network) directory.
//
// Put writes a temp file next to the target, fsyncs it, and renames it into
// place (then fsyncs the directory), so readers see the old or the complete
// new object. Temp files are named ".spotagent-tmp-*" and never listed;
// Cleanup removes the ones a crashed writer left.
package file

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

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
	owner := ownerOf(fi)
	trusted := func(uid int) bool { return uid == 0 || uid == euid || (readOnly && uid == owner) }
	where := real
	if real != abs {
		where = abs + " (-> " + real + ")"
	}
	if !trusted(owner) {
		return "", fmt.Errorf("%w: %s (mode %s) is owned by %s, not by %s that runs spotagent: that user can plant a checkpoint there; chown it, or pick a directory of your own",
			ErrUntrusted, where, fi.Mode(), uidName(owner), uidName(euid))
	}
	if m := fi.Mode(); m.Perm()&0o022 != 0 {
		return "", fmt.Errorf("%w: %s (owner %s, mode %s) is writable by group or others: they can plant a checkpoint there; chmod go-w it (chmod 700), or pick a directory of your own",
			ErrUntrusted, where, uidName(owner), m)
	}
	for d := filepath.Dir(real); ; d = filepath.Dir(d) {
		fi, err := os.Lstat(d) // real holds no symlink
		if err != nil {
			return "", err
		}
		m := fi.Mode()
		switch {
		case !trusted(ownerOf(fi)):
			return "", fmt.Errorf("%w: %s, above the store %s, is owned by %s (mode %s): that user can replace the store; pick a directory elsewhere",
				ErrUntrusted, d, where, uidName(ownerOf(fi)), m)
		case m.Perm()&0o022 != 0 && m&os.ModeSticky == 0:
			return "", fmt.Errorf("%w: %s, above the store %s, is writable by group or others and not sticky (owner %s, mode %s): they can replace the store; chmod go-w or +t it, or pick a directory elsewhere",
				ErrUntrusted, d, where, uidName(ownerOf(fi)), m)
		}
		if d == filepath.Dir(d) {
			return real, nil
		}
	}
}

// ErrUntrusted is a store directory that a user other than the agent's
// (or root) can change.
var ErrUntrusted = errors.New("untrusted store directory")

// ownerOf is fi's owner uid (-1: unknown, trusted by nobody).
func ownerOf(fi os.FileInfo) int {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid)
	}
	return -1
}

// uidName is "uid N (name)", the name when the user database has it.
func uidName(uid int) string {
	s := "uid " + strconv.Itoa(uid)
	if u, err := user.LookupId(strconv.Itoa(uid)); err == nil && u.Username != "" {
		s += " (" + u.Username + ")"
	}
	return s
}

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

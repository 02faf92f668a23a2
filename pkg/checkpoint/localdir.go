package checkpoint

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
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
// size is not want (the size the scan saw).
func OpenScanned(root *os.Root, rel string, want int64) (*os.File, error) {
	fh, err := root.OpenFile(rel, os.O_RDONLY|ONonblock, 0)
	if err != nil {
		return nil, err
	}
	err = CheckRegular(root, rel, fh, want)
	if err != nil {
		fh.Close()
		return nil, err
	}
	return fh, nil
}

// CheckRegular checks fh, opened as rel below root, as OpenScanned does:
// a regular file, the trainer's own where OwnedBy says so, of size want,
// and still the file at rel.
func CheckRegular(root *os.Root, rel string, fh *os.File, want int64) error {
	info, err := fh.Stat()
	if err != nil {
		return err
	}
	if !info.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file (%s): %w", rel, info.Mode().Type(), ErrRefused)
	}
	if err := checkOwner(root, rel, info); err != nil {
		return err
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

// owners holds the roots OwnedBy marked: root → the uids whose files may
// be read through it.
var owners sync.Map

// OwnedBy marks root, a checkpoint directory written by a trainer of
// another user than the agent's (node and sidecar modes, an agent running
// as root), as that trainer's: until the returned func is called, every
// file read through root for an upload or a verification must be owned by
// one of uids and have a single link. Otherwise a trainer could hard-link
// a file only the agent may read (fs.protected_hardlinks=0) into its
// checkpoint and read it back from the store. No uids: nothing is marked.
func OwnedBy(root *os.Root, uids ...int) func() {
	if root == nil || len(uids) == 0 {
		return func() {}
	}
	owners.Store(root, uids)
	return func() { owners.Delete(root) }
}

// ErrNotOwned reports a file a trainer of another user than the agent put
// in its checkpoint that is not its own (OwnedBy's rule): never uploaded.
var ErrNotOwned = fmt.Errorf("not the trainer's own file: %w", ErrRefused)

// checkOwner applies OwnedBy's rule to the file rel below root (info: its
// fstat).
func checkOwner(root *os.Root, rel string, info fs.FileInfo) error {
	v, ok := owners.Load(root)
	if !ok {
		return nil
	}
	return CheckOwnedBy(rel, info, v.([]int))
}

// CheckOwnedBy checks that the file rel (info: its fstat) is owned by one of
// uids and has a single link.
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

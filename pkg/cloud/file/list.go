package file

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spotagent/spotagent/pkg/cloud"
)

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

package file

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spotagent/spotagent/pkg/cloud"
)

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

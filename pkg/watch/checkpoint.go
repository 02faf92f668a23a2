package watch

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"
)

// Kinds of checkpoint.
const (
	KindDir  = "dir"
	KindFile = "file"
)

// ErrChanged reports a checkpoint that changed since it was found
// complete: it is not committed, and is tried again once it is quiet.
var ErrChanged = errors.New("checkpoint changed under the agent")

// entry is one file or directory of a checkpoint, as stat saw it.
type entry struct {
	rel   string // "/"-separated, relative to the checkpoint ("." for a file checkpoint itself)
	dir   bool
	size  int64
	mtime time.Time
	ino   uint64
}

// fingerprint lists a checkpoint's entries; equal fingerprints mean
// nothing was written (nor renamed over) in between.
type fingerprint []entry

func (f fingerprint) equal(g fingerprint) bool { return slices.Equal(f, g) }

func (f fingerprint) files() int {
	n := 0
	for _, e := range f {
		if !e.dir {
			n++
		}
	}
	return n
}

func (f fingerprint) bytes() int64 {
	var n int64
	for _, e := range f {
		if !e.dir {
			n += e.size
		}
	}
	return n
}

func (f fingerprint) has(rel string) bool {
	for _, e := range f {
		if e.rel == rel && !e.dir {
			return true
		}
	}
	return false
}

// Checkpoint is one complete checkpoint found in DIR.
type Checkpoint struct {
	Name string // its name in DIR: what a restore puts back
	Kind string // KindDir or KindFile
	Step int64
	Path string // DIR/Name
	fp   fingerprint
}

// Bytes is the checkpoint's size when it was found complete.
func (c *Checkpoint) Bytes() int64 { return c.fp.bytes() }

// Metadata is the manifest's trainer metadata for c: restore reads the
// original name and kind back from it.
func (c *Checkpoint) Metadata() json.RawMessage {
	b, _ := json.Marshal(map[string]any{"watch": origin{Name: c.Name, Kind: c.Kind, Step: c.Step}})
	return b
}

// origin is what the manifest's metadata.watch records.
type origin struct {
	Name string `json:"name"`
	Kind string `json:"kind"`
	Step int64  `json:"step"`
}

// Verify checks that nothing in c changed since it was found complete:
// same files, sizes, mtimes and inodes. It is called after the upload and
// before the manifest is written.
func (c *Checkpoint) Verify() error {
	fp, err := snapshot(c.Path)
	if err != nil {
		return fmt.Errorf("%s: %w: %v", c.Name, ErrChanged, err)
	}
	if !fp.equal(c.fp) {
		return fmt.Errorf("%s: %w: a file was written, added, removed or replaced during the upload", c.Name, ErrChanged)
	}
	return nil
}

// snapshot stats a checkpoint: a regular file, or a directory tree of
// regular files. Symlinks (wherever they lead), devices, sockets and pipes
// refuse the whole checkpoint, as in protocol mode.
func snapshot(p string) (fingerprint, error) {
	fi, err := os.Lstat(p)
	if err != nil {
		return nil, err
	}
	switch {
	case fi.Mode().IsRegular():
		return fingerprint{stat(".", fi)}, nil
	case !fi.IsDir():
		return nil, refused(p, fi.Mode())
	}
	var fp fingerprint
	err = filepath.WalkDir(p, func(q string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(p, q)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if !info.IsDir() && !info.Mode().IsRegular() {
			return refused(q, info.Mode())
		}
		fp = append(fp, stat(filepath.ToSlash(rel), info))
		return nil
	})
	return fp, err
}

func stat(rel string, fi fs.FileInfo) entry {
	e := entry{rel: rel, dir: fi.IsDir(), size: fi.Size(), mtime: fi.ModTime()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.ino = st.Ino
	}
	if e.dir {
		e.size = 0 // a directory's size says nothing a file's entry does not
	}
	return e
}

func refused(p string, m fs.FileMode) error {
	what := m.Type().String()
	if m&fs.ModeSymlink != 0 {
		what = "a symlink"
		if t, err := os.Readlink(p); err == nil {
			what += " to " + t
		}
	}
	return fmt.Errorf("%s is %s, not a regular file: %w", p, what, checkpoint.ErrRefused)
}

// StageIn makes the directory stage (relative to dir, the watched
// directory opened as a root; created, parents too) holding hard links to
// c's files (KindFile: the file itself, under its name), for the
// committer to upload and remove afterwards. Everything goes through dir,
// so a trainer that swaps a path for a symlink meanwhile cannot make the
// agent link or create anything outside it. Links share the trainer's
// inodes, so Verify still sees a write in place; a file the trainer
// replaces keeps its old, complete content in the link.
func (c *Checkpoint) StageIn(dir *os.Root, stage string) error {
	if err := dir.MkdirAll(stage, 0o700); err != nil {
		return err
	}
	if err := c.link(dir, stage); err != nil {
		dir.RemoveAll(stage)
		return fmt.Errorf("stage %s: %w", c.Name, err)
	}
	return nil
}

func (c *Checkpoint) link(dir *os.Root, stage string) error {
	if c.Kind == KindFile {
		return dir.Link(c.Name, path.Join(stage, c.Name))
	}
	for _, e := range c.fp {
		if e.rel == "." {
			continue
		}
		dst := path.Join(stage, e.rel)
		if e.dir {
			if err := dir.MkdirAll(dst, 0o700); err != nil {
				return err
			}
			continue
		}
		if err := dir.Link(path.Join(c.Name, e.rel), dst); err != nil {
			return err
		}
	}
	return nil
}

// errRefused is checkpoint.ErrRefused: what must never be uploaded.
var errRefused = checkpoint.ErrRefused

// Written is when c was last written: its newest mtime.
func (c *Checkpoint) Written() time.Time {
	var t time.Time
	for _, e := range c.fp {
		if e.mtime.After(t) {
			t = e.mtime
		}
	}
	return t
}

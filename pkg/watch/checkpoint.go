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
	"time"

	"github.com/spotagent/spotagent/pkg/checkpoint"
)

// Kinds of checkpoint.
const (
	kindDir  = "dir"
	kindFile = "file"
)

// ErrChanged reports a checkpoint that changed since it was found
// complete: it is not committed, and is tried again once it is quiet.
var ErrChanged = errors.New("checkpoint changed under the agent")

// entry is one file or directory of a checkpoint, as lstat saw it.
type entry struct {
	rel   string // "/"-separated, relative to the checkpoint ("." for a file checkpoint itself)
	dir   bool
	size  int64
	mtime int64 // UnixNano
	id    checkpoint.FileIdent
	nlink uint64 // hard links: the agent's staging adds one, a deletion of the original takes one
	uid   int    // owner (-1: unknown)
}

// fingerprint lists a checkpoint's entries; equal fingerprints mean
// nothing was written (nor renamed over) in between.
type fingerprint []entry

func (f fingerprint) equal(g fingerprint) bool { return slices.Equal(f, g) }

// sameData is equal but for ctimes: what the agent's own hard links (and
// their removal) change. Completeness is judged with it; Verify, after
// the links are made, uses equal.
func (f fingerprint) sameData(g fingerprint) bool {
	return slices.EqualFunc(f, g, func(a, b entry) bool {
		return a.rel == b.rel && a.dir == b.dir && a.id.SameData(b.id)
	})
}

// find returns the entry for rel (nil: none).
func (f fingerprint) find(rel string) *entry {
	for i := range f {
		if f[i].rel == rel {
			return &f[i]
		}
	}
	return nil
}

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
	Kind string // kindDir or kindFile
	Step int64
	Path string // DIR/Name
	fp   fingerprint
	root *os.Root // DIR, the watcher's handle on it

	stage  string      // where StageIn linked it, relative to root ("": not staged)
	staged fingerprint // the staged links as StageIn left them

	owner ownerRule // whose files it may hold (owner.go)
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

// Verify checks that what is staged for upload is still the checkpoint
// found complete. Once staged, the hard links in the stage are what the
// committer uploads, so they are what is checked: each the same file
// (device, inode), size and mtime, and the same ctime unless the only
// change is a link fewer (the trainer deleting or rotating the original:
// the links still hold its complete data). What is left of the original
// must not have changed either: a file added or replaced there, or written
// through the original name, says the checkpoint was not complete when it
// was found (a short quiet window after the marker can be wrong); a
// checkpoint deleted in part or in whole is not a change. Before staging
// (tests), the original is checked as it is. Verify is called after the
// upload and before the manifest is written.
func (c *Checkpoint) Verify() error {
	if c.stage == "" {
		fp, err := snapshot(c.root, c.Name)
		if err != nil {
			return fmt.Errorf("%s: %w: %v", c.Name, ErrChanged, err)
		}
		if !fp.equal(c.fp) {
			return fmt.Errorf("%s: %w: a file was written, added, removed or replaced during the upload", c.Name, ErrChanged)
		}
		return nil
	}
	sp, err := snapshot(c.root, c.stagedName())
	if err != nil {
		return fmt.Errorf("%s: %w: the staged copy: %v", c.Name, ErrChanged, err)
	}
	if err := sameStaged(c.staged, sp, true); err != nil {
		return fmt.Errorf("%s: %w: %v", c.Name, ErrChanged, err)
	}
	fp, err := snapshot(c.root, c.Name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil // deleted (rotated) meanwhile, or being deleted: the links hold it
	case err != nil:
		return fmt.Errorf("%s: %w: %v", c.Name, ErrChanged, err)
	}
	for _, e := range fp {
		if e.dir {
			continue
		}
		s := c.fp.find(e.rel)
		if s == nil || s.dir || !s.id.SameData(e.id) {
			return fmt.Errorf("%s: %w: %s was written, added or replaced during the upload", c.Name, ErrChanged, e.rel)
		}
	}
	return nil
}

// stagedName is the staged copy below root: the stage directory for a
// directory checkpoint, the file in it for a file checkpoint.
func (c *Checkpoint) stagedName() string {
	if c.Kind == kindFile {
		return path.Join(c.stage, c.Name)
	}
	return c.stage
}

// sameStaged compares the staged links now (got) with as they were staged
// (want): the same files, each the same file, size and mtime; with
// ctimes, unchanged but for a ctime moved by the original's removal (a
// link fewer).
func sameStaged(want, got fingerprint, ctimes bool) error {
	if want.files() != got.files() {
		return fmt.Errorf("the staged copy has %d files, staged %d", got.files(), want.files())
	}
	for _, e := range got {
		if e.dir {
			continue
		}
		w := want.find(e.rel)
		switch {
		case w == nil || w.dir:
			return fmt.Errorf("%s appeared in the staged copy", e.rel)
		case !w.id.SameData(e.id):
			return fmt.Errorf("%s was written during the upload", e.rel)
		case ctimes && w.id != e.id && e.nlink >= w.nlink:
			// ctime moved with no link removed: written in place with its
			// mtime put back, or its mode changed.
			return fmt.Errorf("%s was modified during the upload", e.rel)
		}
	}
	return nil
}

// snapshot stats the checkpoint name below dir (DIR): a regular file, or a
// directory tree of regular files, all through dir, never by path.
// Symlinks (wherever they lead), devices, sockets and pipes refuse the
// whole checkpoint, as in protocol mode; directories are opened with
// O_NONBLOCK|O_DIRECTORY|O_NOFOLLOW, so nothing swapped in for one can
// block or lead elsewhere.
func snapshot(dir *os.Root, name string) (fingerprint, error) {
	if testHookSnapshot != nil {
		testHookSnapshot(name)
	}
	fi, err := dir.Lstat(name)
	if err != nil {
		return nil, err
	}
	switch {
	case fi.Mode().IsRegular():
		return fingerprint{stat(".", fi)}, nil
	case !fi.IsDir():
		return nil, refused(dir, name, fi.Mode())
	}
	sub, err := checkpoint.OpenDir(dir, name) // refuses a symlink swapped in since
	if err != nil {
		return nil, err
	}
	defer sub.Close()
	top, err := sub.Stat(".")
	if err != nil {
		return nil, err
	}
	fp := fingerprint{stat(".", top)}
	if err := walk(dir, name, sub, ".", &fp); err != nil {
		return nil, err
	}
	return fp, nil
}

// testHookSnapshot, when set, runs as snapshot begins: tests hold a walk up.
var testHookSnapshot func(name string)

// walk adds what the directory rel below sub (DIR/name) holds to fp, in
// name order, depth first.
func walk(dir *os.Root, name string, sub *os.Root, rel string, fp *fingerprint) error {
	ents, err := readDir(sub, rel)
	if err != nil {
		return err
	}
	for _, e := range ents {
		q := path.Join(rel, e.Name())
		info, err := sub.Lstat(q) // not e.Info(): that goes by path
		if err != nil {
			return err
		}
		switch {
		case info.IsDir():
			*fp = append(*fp, stat(q, info))
			if err := walk(dir, name, sub, q, fp); err != nil {
				return err
			}
		case info.Mode().IsRegular():
			*fp = append(*fp, stat(q, info))
		default:
			return refused(dir, path.Join(name, q), info.Mode())
		}
	}
	return nil
}

func stat(rel string, fi fs.FileInfo) entry {
	e := entry{rel: rel, dir: fi.IsDir(), size: fi.Size(), mtime: fi.ModTime().UnixNano(), id: checkpoint.IdentOf(fi), nlink: nlinkOf(fi), uid: uidOf(fi)}
	if e.dir {
		e.size = 0 // a directory's size says nothing a file's entry does not
	}
	return e
}

// refused is the error for rel below dir, which is not a regular file or
// a directory.
func refused(dir *os.Root, rel string, m fs.FileMode) error {
	what := m.Type().String()
	if m&fs.ModeSymlink != 0 {
		what = "a symlink"
		if t, err := dir.Readlink(rel); err == nil {
			what += " to " + t
		}
	}
	return fmt.Errorf("%s is %s, not a regular file: %w", filepath.Join(dir.Name(), rel), what, checkpoint.ErrRefused)
}

// StageIn makes the directory stage (relative to dir, the watched
// directory opened as a root; created, parents too) holding hard links to
// c's files (kindFile: the file itself, under its name), for the
// committer to upload and remove afterwards. Everything goes through dir,
// so a trainer that swaps a path for a symlink meanwhile cannot make the
// agent link or create anything outside it. Links share the trainer's
// inodes, so Verify still sees a write in place; a file the trainer
// replaces or deletes (checkpoint rotation) keeps its old, complete
// content in the link.
func (c *Checkpoint) StageIn(dir *os.Root, stage string) error {
	if err := dir.MkdirAll(stage, 0o700); err != nil {
		return err
	}
	if err := c.link(dir, stage); err != nil {
		dir.RemoveAll(stage)
		return fmt.Errorf("stage %s: %w: %v", c.Name, ErrChanged, err)
	}
	// The links are what is uploaded: they must be the files found
	// complete (a file replaced or written between the scan and the link
	// would not be).
	c.stage = stage
	sp, err := snapshot(dir, c.stagedName())
	if err == nil {
		err = sameStaged(c.fp, sp, false)
	}
	if err != nil {
		dir.RemoveAll(stage)
		c.stage = ""
		return fmt.Errorf("stage %s: %w: %v", c.Name, ErrChanged, err)
	}
	// What is uploaded is the staged links' inodes: their owner decides.
	if err := c.owner.check(sp, c.Name); err != nil {
		dir.RemoveAll(stage)
		c.stage = ""
		return fmt.Errorf("stage: %w", err)
	}
	c.staged = sp
	return nil
}

func (c *Checkpoint) link(dir *os.Root, stage string) error {
	if c.Kind == kindFile {
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
		if m := time.Unix(0, e.mtime); m.After(t) {
			t = m
		}
	}
	return t
}

package watch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/spotagent/spotagent/pkg/checkpoint"
	"github.com/spotagent/spotagent/pkg/checkpoint/restore"
	"github.com/spotagent/spotagent/pkg/cloud"
)

// Restored is a checkpoint put back into DIR under its original name.
type Restored struct {
	*restore.Result
	Name string
	Kind string
	Path string // DIR/Name
}

// ErrNotWatched reports a committed checkpoint without the original name a
// watch-mode commit records: one the protocol mode committed.
var ErrNotWatched = errors.New("checkpoint was not committed in watch mode")

// Restore puts the newest committed checkpoint back into w's DIR under
// the name it had there, so that the framework's own resume finds it. It
// downloads and verifies into a hidden directory inside DIR, then renames:
// the trainer never sees a partial checkpoint. What stands in its way is
// moved aside (".spotagent-aside-..."), never deleted: a local copy of the
// same name that does not verify, and, for a layout with a completion
// marker, newer local checkpoints without it (torn writes the framework's
// resume would otherwise pick). Everything goes through DIR as New opened
// it: a symlink the trainer puts anywhere in DIR is never followed out of
// it, and a FIFO or device is never opened for reading (it is not a
// verified copy: it is moved aside). It returns restore.ErrNoCheckpoint
// when the store holds none.
func (w *Watcher) Restore(ctx context.Context, st cloud.Store, opts restore.Options) (*Restored, error) {
	dir := w.root
	tmp, err := checkpoint.MkdirTemp(dir, reserved+"restore-")
	if err != nil {
		return nil, fmt.Errorf("restore into %s: %w", w.cfg.Dir, err)
	}
	defer dir.RemoveAll(tmp)
	into, err := checkpoint.OpenDir(dir, tmp)
	if err != nil {
		return nil, fmt.Errorf("restore into %s: %w", w.cfg.Dir, err)
	}
	// DIR's own copy of the checkpoint, if it is still there, first: only
	// what it lacks, or what differs, is read from the store.
	opts.Tiers = append([]checkpoint.Tier{w.Tier()}, opts.Tiers...)
	r, err := restore.Into(ctx, st, into, filepath.Join(w.cfg.Dir, tmp), opts)
	into.Close()
	if err != nil {
		return nil, err
	}
	o, err := originOf(r.Manifest)
	if err != nil {
		return nil, err
	}
	src := path.Join(tmp, filepath.Base(r.Dir))
	if o.Kind == kindFile {
		if len(r.Manifest.Files) != 1 || r.Manifest.Files[0].Path != o.Name {
			return nil, fmt.Errorf("restore %s: a file checkpoint must hold exactly the file %q", r.Key, o.Name)
		}
		src = path.Join(src, o.Name)
	}
	res := &Restored{Result: r, Name: o.Name, Kind: o.Kind, Path: filepath.Join(w.cfg.Dir, o.Name)}
	w.asideTorn(o.Step)
	if _, err := dir.Lstat(o.Name); err == nil {
		err := w.sameAs(o.Name, o.Kind, r.Manifest)
		if err == nil {
			w.log.Info("checkpoint already in the watched directory and verified: not replacing it", zap.String("path", res.Path))
			return res, nil
		}
		if err := w.aside(o.Name, "differs from the committed checkpoint of the same name: "+err.Error()); err != nil {
			return nil, err
		}
	}
	// The trainer's, as if it had written it (owner.go).
	if err := w.owner.chownTree(dir, src); err != nil {
		return nil, fmt.Errorf("restore into %s: give it to uid %d: %w", res.Path, w.owner.uid, err)
	}
	if err := dir.Rename(src, o.Name); err != nil {
		return nil, fmt.Errorf("restore into %s: %w", res.Path, err)
	}
	return res, nil
}

func originOf(m *checkpoint.Manifest) (origin, error) {
	var meta struct {
		Watch *origin `json:"watch"`
	}
	if len(m.Metadata) > 0 {
		if err := json.Unmarshal(m.Metadata, &meta); err != nil {
			return origin{}, fmt.Errorf("checkpoint %s: metadata: %w", m.ID, err)
		}
	}
	o := meta.Watch
	if o == nil {
		// Not restored under a made-up name: the framework's resume would
		// load whatever layout the client library's trainer wrote.
		return origin{}, fmt.Errorf("checkpoint %s (step %d): %w: it was committed through the client library (protocol mode), "+
			"which records no name in the watched directory, so it cannot be put back where the framework's resume looks: "+
			"run this trainer without --watch to resume it (SPOTAGENT_RESUME_DIR), or copy it out with "+
			"`spotagent restore --id %s --dest DIR/<name>` and use a new --store for --watch", m.ID, m.Step, ErrNotWatched, m.ID)
	}
	if err := validName(o.Name); err != nil {
		return origin{}, fmt.Errorf("checkpoint %s: %w", m.ID, err)
	}
	if o.Kind != kindDir && o.Kind != kindFile {
		return origin{}, fmt.Errorf("checkpoint %s: unknown kind %q", m.ID, o.Kind)
	}
	o.Step = m.Step
	return *o, nil
}

// asideTorn moves newer checkpoints that lack their completion marker out
// of the way, and warns of every newer one it leaves: the framework's own
// resume will load that one, which no commit verified, rather than the
// restored one. w.mu is not held.
func (w *Watcher) asideTorn(step int64) {
	ents, err := readDir(w.root, ".")
	if err != nil {
		return
	}
	for _, e := range ents {
		name := e.Name()
		if !w.namer.Match(name) {
			continue
		}
		s, err := w.namer.Step(name, !e.IsDir())
		if err != nil || s <= step {
			continue
		}
		if m := w.marker(name, kindDir); e.IsDir() && m != "" {
			if _, err := w.root.Lstat(path.Join(name, m)); errors.Is(err, os.ErrNotExist) {
				w.aside(name, "newer than the restored checkpoint but without "+m+": a torn write")
				continue
			}
		}
		w.log.Warn("a checkpoint newer than the committed one is in the watched directory: the trainer's own resume will probably load it, not the restored one",
			zap.String("name", name), zap.Int64("step", s), zap.Int64("committed_step", step),
			zap.String("why", "it was written after the last commit, or the agent stopped before its upload: no commit verified it"),
			zap.String("fix", "nothing if it is complete; if the trainer fails to load it, move it out of "+w.cfg.Dir))
	}
}

// aside renames DIR/name to a hidden name beside it (a symlink itself,
// never what it points to).
func (w *Watcher) aside(name, why string) error {
	to := reserved + "aside-" + name + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if err := w.root.Rename(name, to); err != nil {
		return fmt.Errorf("move %s aside: %w", name, err)
	}
	w.log.Warn("moved a local checkpoint aside", zap.String("name", name), zap.String("to", filepath.Join(w.cfg.Dir, to)), zap.String("why", why))
	return nil
}

// testHookSameAs, when set, runs in sameAs between the listing and the
// reads: tests swap files there.
var testHookSameAs func()

// sameAs checks the local checkpoint name against a manifest: the same
// files, sizes and digests. Nothing is followed out of DIR and nothing but
// a regular file is read: each file is opened O_NONBLOCK|O_NOFOLLOW (a
// FIFO or device swapped in cannot block) and must be, by fstat, a regular
// file and the very one listed.
func (w *Watcher) sameAs(name, kind string, m *checkpoint.Manifest) error {
	fp, err := snapshot(w.root, name)
	if err != nil {
		return err
	}
	if fp.files() != len(m.Files) {
		return fmt.Errorf("%d files, manifest lists %d", fp.files(), len(m.Files))
	}
	dir := w.root
	if kind == kindDir {
		if dir, err = checkpoint.OpenDir(w.root, name); err != nil {
			return err
		}
		defer dir.Close()
	}
	if testHookSameAs != nil {
		testHookSameAs()
	}
	for _, f := range m.Files {
		rel, at := f.Path, f.Path
		if kind == kindFile {
			rel, at = ".", name
		}
		if err := sameFile(dir, at, fp.find(rel), f); err != nil {
			return err
		}
	}
	return nil
}

// sameFile checks the file rel below dir, listed as e, against f.
func sameFile(dir *os.Root, rel string, e *entry, f checkpoint.File) error {
	if e == nil || e.dir {
		return fmt.Errorf("%s: not in the local copy", f.Path)
	}
	fh, err := dir.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer fh.Close()
	fi, err := fh.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() || !checkpoint.IdentOf(fi).SameData(e.id) {
		return fmt.Errorf("%s: replaced while it was checked (%s): %w", f.Path, fi.Mode().Type(), checkpoint.ErrRefused)
	}
	// The digest, not the CRC32C: other bytes of the same size and
	// CRC32C are easy to make. An entry without one (a manifest from
	// before digests) is not proven: the store's copy replaces it.
	err = f.VerifyDigest(fh)
	if errors.Is(err, checkpoint.ErrCorrupt) {
		return fmt.Errorf("%s differs", f.Path)
	}
	return err
}
